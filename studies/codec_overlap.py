"""Do ranks that share cores encode at once or in turn? For each run of the emulated sweep
(results/tables/emulated_sweep.sweep.csv, or run dirs given), over its last 3 steps: per
dimension, a rank's codec seconds, and while it ran, the mean number of ranks busy on the
cores (not waiting on the wire) and in a codec. With 4 ranks on 2 cores, 4 busy ranks slow a
codec 2x; 1-2 leave it at one thread's speed (perfmodel.predict.codec_on_path assumes the
busy count is set by the codec's share of the collective).

    .venv/bin/python studies/codec_overlap.py                     # the sweep table's runs
    .venv/bin/python studies/codec_overlap.py results/emulated_sweep/<run> ...
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from neoxlab.comm.timeline import codec_overlap, load, step_window

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "results" / "tables" / "emulated_sweep.sweep.csv"


def sweep_runs() -> list[tuple[str, Path]]:
    with TABLE.open() as f:
        return [(f"{r['layout']} {r['rate_mbit']:>4} {r['scheme']:<8}", Path(r["run_dir"]))
                for r in csv.DictReader(f) if r["scheme"] != "none"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--steps", type=int, default=3, help="the last steps to look at")
    args = ap.parse_args()
    runs = [(r.name, r) for r in args.runs] if args.runs else sweep_runs()
    print(f"{'run':<40}{'dim':<6}{'calls':>6}{'codec s':>9}{'busy':>6}{'in codec':>9}")
    for label, run in runs:
        spans = load(run)
        if not spans:
            print(f"{label:<40}no timeline (run before timelines were kept)")
            continue
        for o in codec_overlap(spans, step_window(run, args.steps)):
            print(f"{label:<40}{o.dim:<6}{o.calls_per_rank:>6.1f}{o.codec_s_per_rank:>9.3f}"
                  f"{o.busy_ranks:>6.2f}{o.codec_ranks:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
