"""Decode steps with the C++ decode attention (serve.native_attention) against SDPA, side by
side in one process: the same model, cache, tokens and positions, the two alternating in
every round (this machine is shared and noisy), medians per row count.

    python bench/decode_attention.py                              # 8 layers, hidden 512, 2 threads
    python bench/decode_attention.py --layers 6 --hidden 256 --threads 1 --position 60  # sweep's

Rows attend up to random positions in [position / 2, position]: SDPA reads every row up to
the longest, the kernel each row up to its own.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.distributed import init_single_process
from neoxlab.serve.weights import build_serve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--position", type=int, default=200)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    max_seq = args.position + 1
    cfg = ModelConfig(num_layers=args.layers, hidden_size=args.hidden,
                      num_attention_heads=args.heads, seq_length=max_seq,
                      max_position_embeddings=max_seq)
    init_single_process()
    model = build_serve_model(cfg, "random", 1234, 1, 0, max_seq)
    attention = model.use_native_attention(True)
    if attention != "native":
        raise SystemExit(f"decode attention: {attention}")
    cache = model.new_cache(max(args.rows), max_seq)
    g = torch.Generator().manual_seed(0)
    print(f"{args.layers} layers, hidden {args.hidden}, {args.threads} thread(s), positions "
          f"in [{args.position // 2}, {args.position}]; ms per decode step, medians of "
          f"{args.rounds} alternating rounds")
    for rows in args.rows:
        tokens = torch.randint(0, cfg.vocab_size, (rows,), generator=g)
        positions = torch.randint(args.position // 2, args.position + 1, (rows,), generator=g)
        span = int(positions.max()) + 1
        took: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for native in (True, False) if r % 2 else (False, True):
                model.native_attend = native
                start = time.perf_counter()
                for _ in range(3):
                    model.decode(tokens, positions, 0, cache, span).argmax(-1).tolist()
                took[native].append((time.perf_counter() - start) / 3 * 1e3)
        native, sdpa = (statistics.median(took[k]) for k in (True, False))
        print(f"rows {rows:3d}: native {native:7.2f}  sdpa {sdpa:7.2f}  "
              f"sdpa / native {sdpa / native:.2f}x")


if __name__ == "__main__":
    main()
