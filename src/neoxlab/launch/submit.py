"""The one submit-and-record step used by `make run`, `make resume` and a requeue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from neoxlab.config import Config
from neoxlab.launch import manifest, scheduler_module
from neoxlab.run import rundir


def submit_and_record(cfg: Config, run_dir: Path, failed: rundir.State, failure: str,
                      **fields: Any) -> str | None:
    """Submit the run dir's job script; append the job to the manifest (with `fields`).

    On failure the run goes to state `failed` with "<failure>: <reason>" as its error, one
    line is printed and None returned: the caller decides the exit code."""
    scheduler = scheduler_module(cfg.cluster.scheduler)
    try:
        job_id = scheduler.submit(run_dir / scheduler.SCRIPT_NAME)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        rundir.set_status(run_dir, failed, error=failure.format(exc=exc))
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return None
    manifest.record_job(run_dir, cfg, job_id, **fields)
    return job_id
