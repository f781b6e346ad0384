"""The four schemes on 2 emulated nodes, side by side at each inter-node rate: throughput gain
over baseline per scheme, and the baseline's communication share of a step.

Needs root + iproute2; run it alone (it is heavy):
    /work/heavy .venv/bin/python bench/emulated_sweep.py --rates none 200 40 --steps 6
Writes results/tables/emulated_sweep.csv and prints the table. Caveat: comm_share divides
all accounted comm time (start-up broadcasts included) by the timed steps, so it overstates
the share of short runs (above 100 % at 40 Mbit/s, 5 steps); per-step comm time is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("none", "naive", "zhybrid", "mzhybrid")


def run(scheme: str, rate: str, args, results: Path) -> Path:
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_2x2", f"compression={scheme}",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"model={args.model}", f"train.steps={args.steps}", "logger.wandb=disabled",
           f"launch.results_dir={results}", "cluster.emulated.prefix=nxsweep"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return sorted((results / "emulated_2x2").iterdir())[-1]


def measure(run_dir: Path, warmup: int) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    network = json.loads((run_dir / "network.json").read_text())
    world = network["nodes"] * network["ranks_per_node"]
    comm_s = sum(t["comm_s"] for t in summary["comm"].values()) / world  # per rank, all steps
    total_s = sum(m["iteration_s"] for m in metrics)
    uplink = sum(u["tx_bytes"] for u in network["uplinks"].values())
    return {
        "samples_per_s": summary["median_samples_per_s"],
        "tflops_per_gpu": summary["median_tflops_per_gpu"],
        "comm_share": comm_s / total_s,
        "uplink_MB_per_step": uplink / len(metrics) / 1e6,
        "final_loss": summary["final_loss"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", nargs="+", default=["none", "200", "40"],
                        help="inter-node Mbit/s per node and direction; none: unshaped")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args()
    rows = []
    for rate in args.rates:
        base = None
        for scheme in SCHEMES:
            m = measure(run(scheme, rate, args, args.results), 2)
            base = base or m
            rows.append({"rate_mbit": rate, "scheme": scheme, **m,
                         "gain_samples": m["samples_per_s"] / base["samples_per_s"] - 1,
                         "gain_tflops": m["tflops_per_gpu"] / base["tflops_per_gpu"] - 1,
                         "baseline_comm_share": base["comm_share"]})
            print(f"{rate:>6} {scheme:<9} {m['samples_per_s']:8.3f} samples/s "
                  f"gain {rows[-1]['gain_samples']:+7.1%}  comm share {m['comm_share']:.0%}  "
                  f"uplinks {m['uplink_MB_per_step']:.2f} MB/step  loss {m['final_loss']:.4f}",
                  flush=True)
    out = args.results / "tables" / "emulated_sweep.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"table: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
