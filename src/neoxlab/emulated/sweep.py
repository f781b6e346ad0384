"""The emulated sweep's measurements: a run dir's training collectives, codec seconds and
uplink bytes, the median run of a point, its rows with the gains over the baseline, and the
sweep table (results/tables/emulated_sweep.sweep.csv). The driver is
studies/emulated_sweep.py; studies/emulated_model.py and the figures read the same table."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("none", "naive", "zhybrid", "mzhybrid")
LAYOUTS = {  # name -> overrides of experiment emulated_sweep
    "2x2": [],  # TP=2 inside a node, DP=2 across 2 nodes (2 ranks share an uplink)
    "4x1": ["cluster.nodes=4", "cluster.ranks_per_node=1", "parallel.tp=1"],  # DP=4
    # the same, ZeRO-1 gradients reduced to their owners (zero.reduce_to_owner)
    "4x1-owner": ["cluster.nodes=4", "cluster.ranks_per_node=1", "parallel.tp=1",
                  "zero.reduce_to_owner=true"],
}
STEP_OPS = ("all_reduce", "reduce", "all_gather", "all_to_all")  # prefixes: reduce_scatter too
TABLE = Path("tables") / "emulated_sweep.sweep.csv"
KEY = ("layout", "rate_mbit", "scheme")



def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_collectives(run_dir: Path) -> tuple[list[dict], dict]:
    """A run's training collectives (comm.jsonl, every rank) and its network.json."""
    network = json.loads((run_dir / "network.json").read_text())
    comm = [r for r in read_jsonl(run_dir / "comm.jsonl") if r["op"].startswith(STEP_OPS)]
    return comm, network


def codec_s(comm: list[dict], network: dict) -> float:
    """A rank's codec seconds over the run, averaged over the ranks."""
    world = network["nodes"] * network["ranks_per_node"]
    return sum(r["compress_s"] + r["decompress_s"] for r in comm) / world


def measure(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    comm, network = step_collectives(run_dir)
    world = network["nodes"] * network["ranks_per_node"]
    comm_s = sum(r["comm_s"] for r in comm) / world
    total_s = sum(m["iteration_s"] for m in metrics)
    uplink = sum(u["tx_bytes"] for u in network["uplinks"].values())
    return {
        "samples_per_s": summary["median_samples_per_s"],
        "tflops_per_gpu": summary["median_tflops_per_gpu"],
        "step_s": summary["median_iteration_s"],
        "comm_share": comm_s / total_s,
        "codec_share": codec_s(comm, network) / total_s,
        "uplink_MB_per_step": uplink / len(metrics) / 1e6,
        "final_loss": summary["final_loss"],
    }


@dataclass(frozen=True)
class Run:
    run_dir: Path
    metrics: dict  # measure()
    load: dict  # other jobs' load during it (run())


def median_run(runs: list[Run]) -> Run:
    """The run of median samples/s (the lower middle of an even count): one real run stands
    for the point, so its loads, codec times and bytes stay those of a single run."""
    return sorted(runs, key=lambda r: r.metrics["samples_per_s"])[(len(runs) - 1) // 2]


def point_rows(layout: str, rate: str, schemes: list[str],
               runs: dict[tuple[str, str], list[Run]]) -> list[dict]:
    """A rate's table rows, gains over the first scheme's (the baseline's) median run, with
    the spread of samples/s over the point's runs."""
    base = median_run(runs[rate, schemes[0]])
    rows = []
    for scheme in schemes:
        mid = median_run(runs[rate, scheme])
        speeds = [r.metrics["samples_per_s"] for r in runs[rate, scheme]]
        rows.append({"layout": layout, "rate_mbit": rate, "scheme": scheme, **mid.metrics,
                     "gain_samples": mid.metrics["samples_per_s"]
                     / base.metrics["samples_per_s"] - 1,
                     "gain_tflops": mid.metrics["tflops_per_gpu"]
                     / base.metrics["tflops_per_gpu"] - 1,
                     "baseline_comm_share": base.metrics["comm_share"], **mid.load,
                     "runs": len(speeds), "samples_per_s_min": min(speeds),
                     "samples_per_s_max": max(speeds), "run_dir": str(mid.run_dir)})
    return rows


def write(rows: list[dict], path: Path) -> None:
    """Merge into the table: a point measured again replaces its earlier row."""
    old = []
    if path.exists():
        with path.open() as f:
            old = list(csv.DictReader(f))
    fresh = {tuple(str(r[k]) for k in KEY) for r in rows}
    kept = [r for r in old if tuple(r[k] for k in KEY) not in fresh]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([*kept, *rows])
