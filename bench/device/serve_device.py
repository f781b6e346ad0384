"""Serving on the GPU, for a lent machine (`--device cpu` is the dry run on CPU).

A tiny GPT-NeoX (its matrices scaled so that no greedy choice rests on a near-tie) is
built at TP=1 on the host and placed on the device, as a serve rank does. The check fails
(exit 1) unless weights, rotary tables, causal bias and the KV cache are on the device, the
CPU-only fast paths (packed products, the native decode attention) are off there, and every
policy of ours serves a trace token for token like the same weights on the CPU while torch's
default device is "meta" (strict-device mode: a step tensor made without naming its device
fails the run).
"""

from __future__ import annotations

import argparse
import sys

import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import ServeLoop
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import WorkloadSpec, make_workload

TINY = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
                   max_position_embeddings=64, vocab_size=200, rotary_pct=0.5)
MAX_SEQ, SLOTS = 48, 6
POLICIES = ("fused", "fused_noreorder", "sequential", "static")


def spread(device: torch.device):
    """TINY on `device`, its matrices scaled by 5 (spread-out logits)."""
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ, device)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    model.use_native_attention(True)
    return model


def tokens(model, requests, name: str) -> list[list[int]]:
    loop = ServeLoop(model, policy_for(name, SLOTS, 0.0), SLOTS, MAX_SEQ)
    with torch.device("meta"):  # strict-device mode
        return [r["tokens"] for r in loop.run(requests).records]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (the dry run)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    init_single_process()
    failures = []
    try:
        model, host = spread(device), spread(torch.device("cpu"))
        where = {t.device for t in [*model.parameters(), *model.buffers()]}
        cache = model.new_cache(SLOTS, MAX_SEQ).k.device
        print(f"weights and tables on {sorted(map(str, where))}, KV cache on {cache}")
        if where != {device} or cache != device:
            failures.append(f"model or cache not on {device}")
        if device.type != "cpu" and (model.packed is not None or model.native_attend):
            failures.append("a CPU-only fast path is on for a GPU model")
        # all arrive at once: admissions do not depend on how fast a step runs
        spec = WorkloadSpec(10, "constant", 0.0, (3, 9), (4, 24), TINY.vocab_size, 7)
        requests = make_workload(spec)
        for name in POLICIES:
            got, want = tokens(model, requests, name), tokens(host, requests, name)
            same = sum(a == b for a, b in zip(got, want, strict=True))
            print(f"{name}: {same}/{len(want)} requests token for token like the CPU")
            if same != len(want):
                failures.append(f"{name}: {len(want) - same} requests differ from the CPU")
    finally:
        shutdown()
    print("serve_device: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
