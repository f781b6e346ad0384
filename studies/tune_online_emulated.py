"""compression=auto when the link changes mid-run: experiment tune_online_emulated starts at
300 Mbit/s uplinks; once its metrics show step --drop-at, the running cluster's uplinks are
reshaped to 40 Mbit/s. A second run of the same experiment at 40 Mbit/s from the start is
the scheme tuned for 40. Reported: the step of the first re-check that finds the change and
of the switch, and the median samples/s of the changed run from the switch + 1 on against
the tuned run's steady steps (the goal: within 20 steps, at least 0.9 x). With --repeats N
the pair runs N times in turn, and the summary takes the medians: of the steps to the
re-tune, and of each run's median samples/s on either side of the ratio.

Needs root + iproute2 and both rates' in-situ profiles; run it alone:
    .venv/bin/python studies/tune_online_emulated.py [--drop-at 30] [--steps 120] [overrides]
    .venv/bin/python studies/tune_online_emulated.py --repeats 3 --steps 60 --drop-at 20
    ... --data docs/measurements/data/<date>-tune-online.runs.jsonl    # + both runs' rows
    .venv/bin/python studies/tune_online_emulated.py --from-data docs/measurements/data/<...>

--data: each pair's two runs (results/rundata.py rows: config, every step's time, loss and
samples/s, bytes), the changed run with its re-check records and the step the uplinks
dropped after; --from-data prints each pair and the summary again from that file alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from neoxlab.comm.online import RECORD_FILE
from neoxlab.config.compose import compose_experiment
from neoxlab.launch.emulated import cluster
from neoxlab.launch.emulated.topology import Topology
from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "tune_online_emulated"


def start(results: Path, rate: int, steps: int, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "neoxlab", f"experiment={EXPERIMENT}",
         f"launch.results_dir={results}", f"cluster.emulated.inter.rate_mbit={rate}",
         f"train.steps={steps}", *overrides], cwd=REPO)


def newest(results: Path) -> Path | None:
    root = results / EXPERIMENT
    runs = sorted(root.iterdir()) if root.exists() else []
    return runs[-1] if runs else None


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def one_pair(args, cfg, pair: int) -> dict:
    """A run whose uplinks drop from 300 to 40 Mbit/s at step --drop-at, then a run at 40
    Mbit/s from the start; the re-tune's steps and speeds."""
    topo = Topology.from_config(cfg.cluster.emulated, cfg.cluster.nodes,
                                cfg.cluster.ranks_per_node)
    before = newest(args.results)
    proc = start(args.results, 300, args.steps, args.overrides)
    while True:  # wait for step --drop-at of the new run
        run = newest(args.results)
        metrics = run / "metrics.jsonl" if run and run != before else None
        if metrics and metrics.exists() and len(records(metrics)) >= args.drop_at:
            break
        if proc.poll() is not None:
            raise SystemExit(f"the 300 Mbit/s run ended ({proc.returncode}) before step "
                             f"{args.drop_at}")
        time.sleep(0.2)
    cluster.reshape_uplinks(topo, dataclasses.replace(cfg.cluster.emulated.inter, rate_mbit=40))
    dropped_at = len(records(metrics))
    if proc.wait():
        raise SystemExit(f"the changed run failed ({proc.returncode}): {run}")
    changed = run
    if start(args.results, 40, args.steps, args.overrides).wait():
        raise SystemExit("the run at 40 Mbit/s failed")
    tuned = newest(args.results)
    rows = pair_rows(changed, tuned, pair, dropped_at, cfg.train.metrics_warmup_steps)
    if args.data:
        rundata.append(args.data, rows)
    return pair_result(*rows, steps=args.steps)


def pair_rows(changed: Path, tuned: Path, pair: int, dropped_at: int, warmup: int
              ) -> list[dict]:
    """A pair's two rows for the --data file: what pair_result reads, kept with each run."""
    return [rundata.run_row(changed, pair=pair, role="changed", dropped_after_step=dropped_at,
                            rechecks=records(changed / RECORD_FILE)),
            rundata.run_row(tuned, pair=pair, role="tuned_for_40",
                            metrics_warmup_steps=warmup)]


def pair_result(changed: dict, tuned: dict, steps: int) -> dict:
    """The re-tune of one pair from its two runs' rows (rundata.run_row, as --data keeps
    them): when the change was seen and acted on, and the speeds on either side."""
    dropped_at = changed["dropped_after_step"]
    checks = [r for r in changed["rechecks"] if r["step"] > dropped_at]
    seen = next((r["step"] for r in checks if any(d["changed"] for d in r["dims"])), None)
    switched = next((r["step"] for r in checks if r["switches"]), None)
    after = [v for step, v in zip(changed["steps"], changed["samples_per_s"], strict=True)
             if step > (switched or seen or steps)]
    steady = [v for step, v in zip(tuned["steps"], tuned["samples_per_s"], strict=True)
              if step > tuned["metrics_warmup_steps"]]
    ratio = statistics.median(after) / statistics.median(steady) if after and steady else None
    retuned = switched or seen  # a change whose re-choice keeps the codecs switches nothing
    return {"changed_run": changed["run_dir"], "tuned_for_40_run": tuned["run_dir"],
            "dropped_after_step": dropped_at, "change_seen_at": seen, "switched_at": switched,
            "steps_to_retune": None if retuned is None else retuned - dropped_at,
            "samples_per_s_after": statistics.median(after) if after else None,
            "samples_per_s_tuned_for_40": statistics.median(steady) if steady else None,
            "ratio": ratio}


def pairs_from_data(path: Path) -> list[dict]:
    """Every pair's result from a --data file alone (steps: the changed run's config)."""
    data = rundata.read(path)
    out = []
    for pair in dict.fromkeys(r["pair"] for r in data):
        (changed,) = [r for r in data if r["pair"] == pair and r["role"] == "changed"]
        (tuned,) = [r for r in data if r["pair"] == pair and r["role"] == "tuned_for_40"]
        out.append(pair_result(changed, tuned, changed["config"]["steps"]))
    return out


def summary(results: list[dict]) -> int:
    for r in results:
        print(json.dumps(r, indent=1), flush=True)
    retunes = [r["steps_to_retune"] for r in results]
    after = [r["samples_per_s_after"] for r in results]
    steady = [r["samples_per_s_tuned_for_40"] for r in results]
    if None in retunes or None in after or None in steady:
        print(f"summary: {len(results)} pairs; some run never re-tuned or has no steps after "
              "the switch (see above)")
        return 1
    ratio = statistics.median(after) / statistics.median(steady)
    print(f"summary: {len(results)} pairs; steps to the re-tune {retunes} (median "
          f"{statistics.median(retunes)}; goal <= 20); median samples/s after the switch "
          f"{statistics.median(after):.3f} against {statistics.median(steady):.3f} tuned for "
          f"40 Mbit/s: {ratio:.3f}x (goal >= 0.9)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drop-at", type=int, default=30)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--repeats", type=int, default=1, help="pairs of runs, in turn")
    p.add_argument("--results", type=Path, default=REPO / "results")
    p.add_argument("overrides", nargs="*", help="for both runs, e.g. "
                   "\"compression.auto.codecs=[none,'zfp:rate=16']\"")
    p.add_argument("--data", type=Path, default=None,
                   help="append each pair's two runs' rows to this data file")
    p.add_argument("--from-data", type=Path, default=None,
                   help="no runs: each pair and the summary from a data file")
    args = p.parse_args()
    if args.from_data:
        return summary(pairs_from_data(args.from_data))
    done = rundata.read(args.data) if args.data and args.data.exists() else []
    first = max((r["pair"] for r in done), default=0) + 1  # pairs of earlier sessions kept
    cfg = compose_experiment(EXPERIMENT, args.overrides)
    return summary([one_pair(args, cfg, first + k) for k in range(args.repeats)])


if __name__ == "__main__":
    sys.exit(main())
