"""F.linear against prepacked weights (neoxlab.serve.packed_linear) at decode sizes.

    .venv/bin/python bench/packed_linear.py [--hidden 512] [--rows 1 2 4 8 16 24 32]
                                            [--threads 1 2] [--repeats 200]

For the lean decode path's four weights of a GPT-NeoX block (QKV, attention out, MLP up and
down) at each row count and thread count: microseconds per product, both ways measured in
alternating rounds of one run, and the ratio (F.linear / packed; > 1: packing pays). The row
count from which the packed product wins is packed_linear.MIN_ROWS.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from serve_profile import wall_ms

from neoxlab.serve.packed_linear import PackedLinear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    h = args.hidden
    shapes = {"qkv": (3 * h, h), "out": (h, h), "up": (4 * h, h), "down": (h, 4 * h)}
    weights = {name: (torch.randn(shape), torch.randn(shape[0])) for name, shape in shapes.items()}
    packed = PackedLinear()
    print(f"{'threads':>7} {'rows':>4}  " + "  ".join(f"{n:>20}" for n in shapes)
          + f"  {'block':>7}")
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for rows in args.rows:
                cells, plain_sum, packed_sum = [], 0.0, 0.0
                for w, b in weights.values():
                    x = torch.randn(rows, w.shape[1])
                    times = {"plain": [], "packed": []}
                    for _ in range(3):  # alternating rounds; the best of each
                        for name, fn in (("plain", F.linear), ("packed", packed.product)):
                            times[name].append(1e3 * wall_ms(
                                lambda fn=fn, x=x, w=w, b=b: fn(x, w, b), args.repeats))
                    plain, fast = min(times["plain"]), min(times["packed"])
                    plain_sum, packed_sum = plain_sum + plain, packed_sum + fast
                    cells.append(f"{plain:6.0f}/{fast:6.0f} {plain / fast:4.2f}x")
                print(f"{threads:>7} {rows:>4}  " + "  ".join(f"{c:>20}" for c in cells)
                      + f"  {plain_sum / packed_sum:6.2f}x")
    print("cells: F.linear us / packed us, ratio; block: the four products together")


if __name__ == "__main__":
    main()
