"""Slurm (sbatch + srun): render the job script, submit it, ask its state."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from neoxlab.config import Config
from neoxlab.launch import jobscript

SCRIPT_NAME = "job.sbatch"
SUBMIT = "sbatch"
# job states in which the job may still run (resume waits for them to end)
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
_STATE = re.compile(r"JobState=(\S+)")


def render(cfg: Config, run_dir: Path) -> str:
    c = cfg.cluster
    values = jobscript.common_values(cfg, run_dir)
    values.update(
        walltime=jobscript.directive_value("cluster.walltime", c.walltime),
        ranks_per_node=str(c.ranks_per_node),
        cores_per_rank=str(max(1, c.cores_per_node // c.ranks_per_node)),
        mpi=jobscript.quote(c.mpi),
        warn_seconds=str(cfg.launch.warn_before_s),
        site_directives=jobscript.site_directives("#SBATCH", [
            *([("--partition=", c.queue)] if c.queue else []),
            *([("--account=", c.account)] if c.account else []),
            *([("--gpus-per-node=", c.gpus_per_node)] if c.gpus_per_node else []),
            *[(f"--{k}=", v) for k, v in c.extra.items()],
        ]),
    )
    return jobscript.render("slurm.sh.tmpl", values)


def submit(script: Path) -> str:
    """`sbatch --parsable` prints '<id>' or '<id>;<cluster>' and returns at once."""
    out = subprocess.run([SUBMIT, "--parsable", str(script)], capture_output=True, text=True,
                         timeout=120, check=False)
    job_id = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not job_id.isdigit():
        detail = f"{out.stdout}{out.stderr}".strip()
        raise RuntimeError(f"sbatch failed (exit {out.returncode}): {detail}")
    return job_id


def job_state(job_id: str) -> str:
    """Slurm's JobState (PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                             text=True, timeout=30, check=False)
    except FileNotFoundError:
        return "unknown (no scontrol here)"
    except subprocess.TimeoutExpired:
        return "unknown (scontrol timed out)"
    found = _STATE.search(out.stdout)
    return found.group(1) if found else "unknown (no longer known to slurmctld)"


def write_script(cfg: Config, run_dir: Path) -> Path:
    return jobscript.write_script(run_dir, SCRIPT_NAME, render(cfg, run_dir))
