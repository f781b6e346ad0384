"""The paper's grid on GPT-NeoX's own train.py on CPU ranks (experiments/paper_grid_neox_cpu),
kept as data: each member's newest run as one row (results/rundata.py: every step's loss and
time, bytes per dimension) plus where its steps came from, and the table of the dated page
computed from those rows alone, as the paper figure (analysis/paper_grid.py) draws them:
median samples/s over the steady steps, gain over the uncompressed run at the same size.

    python -m neoxlab experiment=paper_grid_neox_cpu launch.results_dir=<results>
    python studies/paper_grid_neox_cpu.py --results <results> \\
        --data docs/measurements/data/<date>-paper-grid-neox-cpu.runs.jsonl
    python studies/paper_grid_neox_cpu.py --from-data docs/measurements/data/<...>.runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from neoxlab.results import rundata
from neoxlab.results.load import find_run_dirs
from neoxlab.results.tables import comparison_members

GRID = "paper_grid_neox_cpu"
WARMUP = 2  # train.metrics_warmup_steps of the members: steps 1-2 are left out of medians
DIMS = ("dp", "zero", "tp", "pp")


def rows_of(results: Path) -> list[dict]:
    """The newest run of every member of the grid, with its steps' source and world size."""
    rows = []
    for member in comparison_members(GRID):
        dirs = find_run_dirs(results / member)
        if not dirs:
            raise FileNotFoundError(f"no run of {member} under {results}: run the grid first")
        run_dir = dirs[-1]
        summary = json.loads((run_dir / "summary.json").read_text())
        layout = json.loads((run_dir / "layout.json").read_text())
        rows.append(rundata.run_row(run_dir, member=member, ranks=layout["world_size"],
                                    steps_source=summary.get("steps_source")))
    return rows


def table(rows: list[dict]) -> list[dict]:
    """Per size and scheme: steady median samples/s, its gain over `none` at that size, the
    final loss and MB per dimension before -> after compression."""
    out = []
    for row in rows:
        steady = [v for s, v in zip(row["steps"], row["samples_per_s"], strict=True)
                  if s > WARMUP]
        out.append({"ranks": row["ranks"], "scheme": row["config"]["scheme"],
                    "source": row["steps_source"], "samples_per_s": statistics.median(steady),
                    "final_loss": row["loss"][-1], "bytes": row["bytes"]})
    base = {t["ranks"]: t["samples_per_s"] for t in out if t["scheme"] == "none"}
    for t in out:
        t["gain_pct"] = (t["samples_per_s"] / base[t["ranks"]] - 1) * 100
    return out


def _mb(counts: dict | None) -> str:
    if not counts or not counts.get("bytes_in"):
        return "-"
    before, after = counts["bytes_in"] / 1e6, counts["bytes_out"] / 1e6
    return f"{before:.2f}" if abs(before - after) < 5e-3 else f"{before:.2f} -> {after:.2f}"


def report(rows: list[dict]) -> None:
    print("| ranks | scheme | steps from | samples/s | gain over none | final loss | "
          + " | ".join(f"{d.upper()} MB" for d in DIMS) + " |")
    print("|---:|---|---|---:|---:|---:|" + "---|" * len(DIMS))
    for t in table(rows):
        mbs = " | ".join(_mb(t["bytes"].get(d)) for d in DIMS)
        print(f"| {t['ranks']} | {t['scheme']} | {t['source']} | {t['samples_per_s']:.2f} | "
              f"{t['gain_pct']:+.1f} % | {t['final_loss']:.4f} | {mbs} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, help="the results dir the grid ran into")
    parser.add_argument("--data", type=Path, help="the data file the rows go to")
    parser.add_argument("--from-data", type=Path, help="no runs: the table of a data file")
    args = parser.parse_args()
    if args.from_data:
        report(rundata.read(args.from_data))
        return 0
    if not (args.results and args.data):
        parser.error("--results and --data (or --from-data)")
    rows = rows_of(args.results)
    rundata.append(args.data, rows)
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
