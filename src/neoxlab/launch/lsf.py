"""LSF (bsub + jsrun, e.g. LLNL Lassen): its rules, render the job script, submit it, ask
its state, cancel it."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

from neoxlab.comm.scheme import jsrun_smpiargs
from neoxlab.config import Config
from neoxlab.launch import jobscript
from neoxlab.run.rankjob import RankProgram

SCRIPT_NAME = "job.lsf"
SUBMIT = "bsub"
# job states in which the job may still run (resume waits for them to end)
LIVE_STATES = ("PEND", "RUN", "PSUSP", "USUSP", "SSUSP")
_JOB_ID = re.compile(r"Job <(\d+)>")
WALLTIME = re.compile(r"^(\d+:)?\d+$")  # [HH:]MM
WALLTIME_FORM = "[HH:]MM, e.g. 12:00"


def rules(cfg: Config) -> list[str]:
    """bsub -W takes [HH:]MM with minutes below 60."""
    walltime = cfg.cluster.walltime
    ok = bool(WALLTIME.match(walltime))
    if ok and (":" not in walltime or int(walltime.split(":")[1]) < 60):
        return []
    return [f"cluster.walltime='{walltime}' is not a lsf time limit; write it as "
            f"{WALLTIME_FORM}"]


def render(cfg: Config, run_dir: Path, program: RankProgram) -> str:
    c = cfg.cluster
    values = jobscript.common_values(cfg, run_dir, program)
    cores_per_rs = max(1, c.cores_per_node // c.ranks_per_node)
    values.update(
        walltime=jobscript.directive_value("cluster.walltime", c.walltime),
        resource_sets=str(c.nodes * c.ranks_per_node),
        rs_per_host=str(c.ranks_per_node),
        cores_per_rs=str(cores_per_rs),
        gpus_per_rs=str(1 if c.gpus_per_node else 0),
        bind=f"packed:{cores_per_rs}",
        # every job names Spectrum's CUDA hook: -gpu, -disable_gpu_hooks or off (comm/scheme.py)
        smpiargs=f" --smpiargs={jsrun_smpiargs(cfg)}",
        warn_minutes=str(max(1, math.ceil(cfg.launch.warn_before_s / 60))),  # -wt: minutes
        site_directives=jobscript.site_directives("#BSUB", [
            *([("-q", c.queue)] if c.queue else []),
            *([("-G", c.account)] if c.account else []),
            *[(f"-{k}", v) for k, v in c.extra.items()],
        ]),
    )
    return jobscript.render("lsf.sh.tmpl", values)


def submit(script: Path) -> str:
    """`bsub < script` returns at once with 'Job <id> is submitted to queue <q>.'"""
    with script.open() as stdin:
        out = subprocess.run(
            [SUBMIT], stdin=stdin, capture_output=True, text=True, timeout=120, check=False
        )
    found = _JOB_ID.search(out.stdout)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"bsub failed (exit {out.returncode}): {out.stdout}{out.stderr}".strip())
    return found.group(1)


def job_state(job_id: str) -> str:
    """bjobs' STAT column (PEND, RUN, DONE, EXIT, ...), or why it is unknown."""
    try:
        out = subprocess.run(["bjobs", "-noheader", "-o", "stat", job_id], capture_output=True,
                             text=True, timeout=30, check=False)
    except FileNotFoundError:
        return "unknown (no bjobs here)"
    except subprocess.TimeoutExpired:
        return "unknown (bjobs timed out)"
    return out.stdout.strip() or "unknown (not in bjobs)"


def cancel(job_id: str) -> None:
    """bkill: the ranks get the stop signal first (the job script checkpoints on it)."""
    subprocess.run(["bkill", job_id], capture_output=True, text=True, timeout=60, check=True)


def write_script(cfg: Config, run_dir: Path, program: RankProgram) -> Path:
    return jobscript.write_script(run_dir, SCRIPT_NAME, render(cfg, run_dir, program))
