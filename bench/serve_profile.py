"""Where a serve step's time goes: torch.profiler over the fused decode step and the prompt
phase (by default 8 layers, hidden 512, as bench/flover.py), per op and against the wall time.

    python bench/serve_profile.py [--layers 8] [--hidden 512] [--batch 32] [--position 160]
                                  [--prompts 8] [--prompt-len 24] [--path lean|megatron]
                                  [--skip-prompts] [--sdpa-attention] [--threads 1]

"ops" is the self CPU time of the aten ops the profiler saw; wall - ops is what Python,
module calls and the dispatcher cost around them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from neoxlab.config import ModelConfig
from neoxlab.serve.distributed import init_single_process
from neoxlab.serve.weights import build_serve_model


def wall_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1000


def report(name: str, fn: Callable[[], object], reps: int, top: int) -> None:
    wall = wall_ms(fn, reps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    events = prof.key_averages()
    aten = [e for e in events if e.key.startswith("aten::")]
    ops_ms = sum(e.self_cpu_time_total for e in aten) / 1000 / reps
    print(f"\n== {name}: wall {wall:.2f} ms/call, aten self time {ops_ms:.2f} ms "
          f"({ops_ms / wall:.0%}), python/dispatch {wall - ops_ms:.2f} ms "
          f"({1 - ops_ms / wall:.0%}); ops per call {sum(e.count for e in aten) // reps}")
    rows = sorted(aten, key=lambda e: -e.self_cpu_time_total)[:top]
    for e in rows:
        print(f"  {e.key:40s} {e.self_cpu_time_total / 1000 / reps:7.3f} ms  "
              f"x{e.count // reps}")


def report_prompts(model, prompts: list[list[int]], cache, reps: int, top: int) -> None:
    report("prompt phase, one request", lambda: model.prefill([prompts[0]], [0], cache),
           reps, top)
    report(f"prompt phase, {len(prompts)} requests one by one",
           lambda: [model.prefill([p], [i], cache) for i, p in enumerate(prompts)],
           max(reps // 4, 2), top)
    report(f"prompt phase, {len(prompts)} requests batched",
           lambda: model.prefill(prompts, list(range(len(prompts))), cache),
           max(reps // 4, 2), top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--position", type=int, default=160)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--path", choices=["lean", "megatron"], default="lean")
    ap.add_argument("--skip-prompts", action="store_true", help="decode steps only")
    ap.add_argument("--sdpa-attention", action="store_true",
                    help="decode attention through SDPA, not the C++ kernel "
                    "(serve.native_attention=false)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    max_seq = 288
    cfg = ModelConfig(num_layers=args.layers, hidden_size=args.hidden,
                      num_attention_heads=args.heads, seq_length=max_seq,
                      max_position_embeddings=max_seq)
    init_single_process()
    model = build_serve_model(cfg, "random", 1234, 1, 0, max_seq)
    model.lean = args.path == "lean"
    slots = max(max(args.batch), args.prompts)
    attention = model.use_native_attention(not args.sdpa_attention)
    cache = model.new_cache(slots, max_seq)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    print(f"model: {args.layers} layers, hidden {args.hidden}, path {args.path}, decode "
          f"attention {attention}, {args.threads} thread(s)")
    if not args.skip_prompts:
        report_prompts(model, prompts, cache, args.reps, args.top)
    for n in args.batch:
        tokens = torch.randint(0, cfg.vocab_size, (n,), generator=g)
        positions = torch.full((n,), args.position, dtype=torch.long)
        report(f"decode step, batch {n} at position {args.position}",
               lambda tokens=tokens, positions=positions:
               model.decode(tokens, positions, 0, cache).argmax(-1).tolist(),
               args.reps, args.top)


if __name__ == "__main__":
    main()
