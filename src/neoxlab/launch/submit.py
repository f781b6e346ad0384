"""The one submit-and-record step used by `make run`, `make resume` and a requeue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from neoxlab.config import Config
from neoxlab.launch import manifest
from neoxlab.launch.schedulers import scheduler_of
from neoxlab.run import rundir


def submit_and_record(cfg: Config, run_dir: Path, failed: rundir.State, failure: str,
                      **fields: Any) -> str | None:
    """Submit the run dir's job script; append the job to the manifest (with `fields`).

    On failure the run goes to state `failed` with "<failure>: <reason>" as its error, one
    line is printed and None returned: the caller decides the exit code."""
    scheduler = scheduler_of(cfg)
    try:
        job_id = scheduler.submit(run_dir / scheduler.script_name)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        rundir.set_status(run_dir, failed, error=failure.format(exc=exc))
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return None
    manifest.record_job(run_dir, cfg, job_id, **fields)
    return job_id


def submit_from_login(cfg: Config, run_dir: Path, verb: str, failure: str,
                      **fields: Any) -> int:
    """`make run` and `make resume` on a login node: submit, record, mark the run submitted
    and say how to follow it; the exit code (1 when the submission failed)."""
    job_id = submit_and_record(cfg, run_dir, rundir.State.FAILED, failure, **fields)
    if job_id is None:
        return 1
    rundir.set_status(run_dir, rundir.State.SUBMITTED, job_id=job_id)
    print(f"[neoxlab] {verb} {cfg.cluster.scheduler} job {job_id}; "
          f"`make status EXP={cfg.experiment}` shows its state", flush=True)
    return 0
