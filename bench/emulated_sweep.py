"""The four schemes on emulated nodes, side by side at each inter-node rate: samples/s and
TFLOPS/GPU per scheme, gain over baseline, the measured communication share of a step and
what the uplinks carried; every point is the median run of --repeats runs (default 1) of
experiment emulated_sweep, the spread of samples/s over them kept beside it.

Needs root + iproute2; run it alone (it is heavy, about 15 minutes with the defaults):
    .venv/bin/python bench/emulated_sweep.py --rates none 1000 200 40 10
    .venv/bin/python bench/emulated_sweep.py --repeats 3 --rates none 300 200 80 40
    .venv/bin/python bench/emulated_sweep.py --layout 4x1 --rates none 40
    .venv/bin/python bench/emulated_sweep.py --layout 4x1-owner --rates 200 40
Appends to results/tables/emulated_sweep.sweep.csv (a row per layout, rate and scheme; a
point measured again replaces its row), then `make figures EXP=emulated_sweep` draws it.

comm share: the accounted time of the training collectives (all-reduce, reduce(-scatter),
all-gather, all-to-all; start-up broadcasts left out) per rank over the run's summed step
times. `external`: other jobs' threads competing for the cores while the ranks ran their
steady steps (perfmodel.stretch), the input the performance model takes for a shared
machine; `external_whole_steps`: the same taken over whole steps (it counts the ranks' own
bursts as other jobs' threads), and `others_cores`: cores busy with anything but our
processes (/proc/stat), kept beside it as the check.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from neoxlab.perfmodel.stretch import Sampler, during_steps, steady_window

REPO = Path(__file__).resolve().parents[1]
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


def run(scheme: str, rate: str, layout: str, args) -> tuple[Path, dict]:
    """One sweep point; the run dir and the load of other jobs during its steady steps."""
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_sweep",
           f"compression={scheme}", f"model={args.model}", f"train.steps={args.steps}",
           f"cluster.emulated.inter.rate_mbit={'null' if rate == 'none' else rate}",
           f"launch.results_dir={args.results}", *LAYOUTS[layout]]
    with Sampler("neoxlab.train", interval=0.05) as sampler:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = sorted((args.results / "emulated_sweep").iterdir())[-1]
    records = read_jsonl(run_dir / "metrics.jsonl")
    window = steady_window(records, 2)
    whole = sampler.load(*window)
    return run_dir, {"external": during_steps(sampler, records, 2, 2),
                     "external_whole_steps": whole and whole.external(2),
                     "others_cores": sampler.others_cpu(*window)}


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["none", "1000", "200", "40", "10"],
                        help="inter-node Mbit/s per node and direction; none: unshaped")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="2x2")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--steps", type=int, default=5, help="2 warm-up steps + the median's")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per point, interleaved (every rate and scheme once, then "
                        "again); a point is its median run")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args()
    args.results = args.results.resolve()
    runs: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for repeat in range(1, args.repeats + 1):
        for rate in args.rates:
            for scheme in args.schemes:
                run_dir, load = run(scheme, rate, args.layout, args)
                runs[rate, scheme].append(Run(run_dir, measure(run_dir), load))
                m = runs[rate, scheme][-1].metrics
                print(f"{args.layout} {rate:>5} {scheme:<9} run {repeat}/{args.repeats} "
                      f"{m['samples_per_s']:7.3f} samples/s  comm {m['comm_share']:4.0%}  "
                      f"codec {m['codec_share']:4.0%}  uplinks {m['uplink_MB_per_step']:6.2f} "
                      f"MB/step  external {load['external'] or 0:.1f} (whole steps "
                      f"{load['external_whole_steps'] or 0:.1f}, others' CPU "
                      f"{load['others_cores'] or 0:.2f} cores)  loss {m['final_loss']:.4f}",
                      flush=True)
            rows = point_rows(args.layout, rate, args.schemes, runs)
            write(rows, args.results / TABLE)
            print("  ".join(f"{r['scheme']} {r['gain_samples']:+.1%}" for r in rows[1:])
                  + f"  (gains of the median runs, {len(runs[rate, args.schemes[0]])} per "
                  "point)", flush=True)
    print(f"table: {args.results / TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
