"""F.linear against prepacked weights (neoxlab.serve.packed_linear) at decode sizes.

    .venv/bin/python bench/packed_linear.py [--hidden 512] [--rows 1 2 4 8 16 24 32]
                                            [--threads 1 2] [--repeats 200]

For the lean decode path's four weights of a GPT-NeoX block (QKV, attention out, MLP up and
down) at each row count and thread count: microseconds per product, both ways measured in
alternating rounds of one run, and the ratio (F.linear / packed; > 1: packing pays). The row
count from which the packed product wins is packed_linear.MIN_ROWS. `--padded` adds the
packed product on rows zero-padded to their power-of-two bucket (tried for 2-3 and 5-7 rows;
never faster than packed on the real rows, so the serve path does not pad).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from serve_profile import wall_ms

from neoxlab.serve.packed_linear import PackedLinear, row_bucket


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--padded", action="store_true",
                    help="also packed on rows zero-padded to row_bucket(), output sliced")
    args = ap.parse_args()
    h = args.hidden
    shapes = {"qkv": (3 * h, h), "out": (h, h), "up": (4 * h, h), "down": (h, 4 * h)}
    weights = {name: (torch.randn(shape), torch.randn(shape[0])) for name, shape in shapes.items()}
    packed = PackedLinear()

    def padded(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rows = len(x)
        return packed.product(F.pad(x, (0, 0, 0, row_bucket(rows) - rows)), w, b)[:rows]

    ways = {"plain": F.linear, "packed": packed.product}
    if args.padded:
        ways["padded"] = padded
    print(f"{'threads':>7} {'rows':>4}  " + "  ".join(f"{n:>20}" for n in shapes)
          + f"  {'block':>7}")
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for rows in args.rows:
                cells, sums = [], dict.fromkeys(ways, 0.0)
                for w, b in weights.values():
                    x = torch.randn(rows, w.shape[1])
                    times = {name: [] for name in ways}
                    for _ in range(3):  # alternating rounds; the best of each
                        for name, fn in ways.items():
                            times[name].append(1e3 * wall_ms(
                                lambda fn=fn, x=x, w=w, b=b: fn(x, w, b), args.repeats))
                    best = {name: min(t) for name, t in times.items()}
                    sums = {name: sums[name] + best[name] for name in ways}
                    cell = f"{best['plain']:6.0f}/{best['packed']:6.0f} "
                    cell += f"{best['plain'] / best['packed']:4.2f}x"
                    if args.padded:
                        cell += f" pad {best['plain'] / best['padded']:4.2f}x"
                    cells.append(cell)
                block = f"  {sums['plain'] / sums['packed']:6.2f}x"
                if args.padded:
                    block += f" pad {sums['plain'] / sums['padded']:4.2f}x"
                print(f"{threads:>7} {rows:>4}  " + "  ".join(f"{c:>20}" for c in cells)
                      + block)
    print("cells: F.linear us / packed us, ratio (pad: F.linear / padded packed); block: the"
          " four products together")


if __name__ == "__main__":
    main()
