"""`make status EXP=<name>`: the runs of an experiment, their jobs and states.

Reads results/manifests/<exp>.jsonl (every submission) and each run dir's status.json; asks
the scheduler for jobs it may still know. A sweep experiment (`runs:`) shows its members.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.launch import manifest, scheduler_module
from neoxlab.run import rundir

COLUMNS = ("experiment", "run_id", "scheduler", "job_id", "job_state", "run_state",
           "submitted_at")


def job_state(scheduler: str, job_id: str | None) -> str:
    if scheduler == "local" or job_id is None:
        return "-"
    return scheduler_module(scheduler).job_state(job_id)


def rows_for(experiment: str, results: Path) -> list[dict[str, str]]:
    rows = []
    for entry in manifest.read(results, experiment):
        status_path = Path(entry["run_dir"]) / "status.json"
        run_state = (rundir.read_json(status_path).get("state", "?")
                     if status_path.exists() else "missing run dir")
        rows.append({
            "experiment": experiment, "run_id": entry["run_id"],
            "scheduler": entry["scheduler"], "job_id": entry.get("job_id") or "-",
            "job_state": job_state(entry["scheduler"], entry.get("job_id")),
            "run_state": run_state, "submitted_at": entry["submitted_at"],
        })
    return rows


def format_rows(rows: list[dict[str, str]]) -> str:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    line = "  ".join(c.ljust(widths[c]) for c in COLUMNS)
    body = ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join([line, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.run.status", description=__doc__)
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
