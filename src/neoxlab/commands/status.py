"""`make status EXP=<name>`: the runs of an experiment, their jobs and states.

Reads results/manifests/<exp>.jsonl (every submission) and each run dir's status.json; asks
the scheduler for jobs it may still know. A sweep experiment (`runs:`) shows its members.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psutil

from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.launch import manifest
from neoxlab.launch.schedulers import SCHEDULERS
from neoxlab.run import rundir

COLUMNS = ("experiment", "run_id", "scheduler", "job_id", "job_state", "run_state",
           "submitted_at")


def live_ranks(run_dir: Path) -> list[int]:
    """Pids of this run's ranks that are still alive (from logs/rank<N>.pid)."""
    alive = []
    for path in sorted((run_dir / "logs").glob("rank*.pid")):
        try:
            proc = psutil.Process(int(path.read_text()))
            if any(str(run_dir.name) in part for part in proc.cmdline()):
                alive.append(proc.pid)
        except (ValueError, OSError, psutil.Error):
            continue
    return alive


def report(run_dir: Path) -> None:
    """How a run just launched here ended: state, failing rank, what to do, its numbers."""
    status = rundir.read_json(run_dir / "status.json")
    line = f"[neoxlab] {status['state']}: {run_dir}"
    if status["state"] == "failed":
        line += f"\n[neoxlab] rank {status.get('failed_rank')}: {status.get('error')}"
    if status["state"] in ("failed", "preempted") and (run_dir / "checkpoints").is_dir():
        line += f"\n[neoxlab] continue it from its last checkpoint: make resume RUN={run_dir}"
    summary_path = run_dir / "summary.json"
    s = rundir.read_json(summary_path) if summary_path.exists() else {}
    if s.get("median_samples_per_s") is not None:
        line += (
            f"\n[neoxlab] {s['steps']} steps, final loss {s['final_loss']:.4f}, median "
            f"{s['median_samples_per_s']:.2f} samples/s, "
            f"{s['median_tflops_per_gpu']:.4g} TFLOPS/GPU (steady steps)"
        )
    print(line, flush=True)


def run_state(run_dir: Path, scheduler: str) -> str:
    """status.json's state; a local run that says running with no rank alive is not running
    (its launcher died, or could not write the final state, e.g. on a full disk)."""
    path = run_dir / "status.json"
    if not path.exists():
        return "missing run dir"
    try:
        state = rundir.read_json(path).get("state", "?")
    except (OSError, ValueError) as exc:
        return f"unknown (status.json unreadable: {exc})"
    record = SCHEDULERS.get(scheduler)
    here = record is not None and record.runs_here
    if state == rundir.State.RUNNING and here and not live_ranks(run_dir):
        return "unknown (status.json says running, but no rank of it is alive)"
    return state


def job_state(scheduler: str, job_id: str | None) -> str:
    record = SCHEDULERS.get(scheduler)
    if record is None:
        return f"unknown (no scheduler '{scheduler}' here: {list(SCHEDULERS)})"
    if job_id is None:
        return "-"
    return record.job_state(job_id)


def rows_for(experiment: str, results: Path) -> list[dict[str, str]]:
    rows = []
    for entry in manifest.read(results, experiment):
        rows.append({
            "experiment": experiment, "run_id": entry["run_id"],
            "scheduler": entry["scheduler"], "job_id": entry.get("job_id") or "-",
            "job_state": job_state(entry["scheduler"], entry.get("job_id")),
            "run_state": run_state(Path(entry["run_dir"]), entry["scheduler"]),
            "submitted_at": entry["submitted_at"],
        })
    return rows


def format_rows(rows: list[dict[str, str]]) -> str:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    line = "  ".join(c.ljust(widths[c]) for c in COLUMNS)
    body = ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join([line, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.commands.status", description=__doc__)
    parser.add_argument("experiment")
    parser.add_argument("--results", type=Path, default=None,
                        help="results directory (default: the experiment's launch.results_dir)")
    args = parser.parse_args(argv)
    try:
        cfg = compose_experiment(args.experiment)
    except ConfigError as exc:
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return 2
    results = args.results or Path(cfg.launch.results_dir)
    rows = [r for name in (cfg.runs or [cfg.experiment]) for r in rows_for(name, results)]
    if not rows:
        print(f"[neoxlab] no runs of {args.experiment} under {results} "
              f"(nothing in {manifest.path_of(results, args.experiment)})")
        return 0
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
