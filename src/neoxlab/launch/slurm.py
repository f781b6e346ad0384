"""Slurm (sbatch + srun): its rules, render the job script, submit it, ask its state, cancel
it; and the refusal for this machine's own Slurm while it is down."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from neoxlab.config import Config
from neoxlab.launch import jobscript, pmi_relay
from neoxlab.launch.ranks import rank_command
from neoxlab.run.rankjob import RankProgram

SCRIPT_NAME = "job.sbatch"
SUBMIT = "sbatch"
# job states in which the job may still run (resume waits for them to end)
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
_STATE = re.compile(r"JobState=(\S+)")
WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$|^\d+-\d+$")  # [D-]HH[:MM[:SS]] | MM
WALLTIME_FORM = "[D-]HH:MM:SS or MM, e.g. 12:00:00"
MPI = ("pmi2", "pmix", "pmi1", "none")  # srun --mpi


def rules(cfg: Config) -> list[str]:
    """sbatch --time's forms; srun's --mpi plugins."""
    c, errors = cfg.cluster, []
    if not WALLTIME.match(c.walltime):
        errors.append(f"cluster.walltime='{c.walltime}' is not a slurm time limit; write it "
                      f"as {WALLTIME_FORM}")
    if c.mpi not in MPI:
        errors.append(f"cluster.mpi='{c.mpi}' is not one of {list(MPI)} (srun --mpi)")
    return errors


def problems(cfg: Config) -> list[str]:
    """This machine's own Slurm, not started: the fix is to start it."""
    refusal = local_slurm_refusal(cfg)
    return [refusal] if refusal else []


def render(cfg: Config, run_dir: Path, program: RankProgram) -> str:
    c = cfg.cluster
    values = jobscript.common_values(cfg, run_dir, program)
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
    if c.mpi == "pmi2":  # its plugin misreads MPICH's longest PMI-1 lines (launch/pmi_relay.py)
        python = jobscript.python_of(cfg)
        relayed = pmi_relay.command(rank_command(cfg, run_dir.resolve(), python, program),
                                    python)
        values["rank_command"] = jobscript.command_line(relayed)
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


def cancel(job_id: str) -> None:
    """scancel: Slurm signals the job's steps and ends it."""
    subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60, check=True)


def write_script(cfg: Config, run_dir: Path, program: RankProgram) -> Path:
    return jobscript.write_script(run_dir, SCRIPT_NAME, render(cfg, run_dir, program))


# The single-node Slurm that .ci/slurm-up starts on this machine (configs/cluster/slurm_local):
# when it is down the fix is to start it, not to go to a login node.
LOCAL_CLUSTER = "slurm_local"
START_LOCAL = "start it with `make slurm-up` (runs `bash .ci/slurm-up`, as root), then run again"
PING_TIMEOUT_S = 10


def local_slurm_problem() -> str | None:
    """Why the local Slurm cannot take a job now (not installed, controller not answering);
    None when its controller answers."""
    if shutil.which(SUBMIT) is None:
        return f"{SUBMIT} is not on this machine: Slurm is not installed"
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                             timeout=PING_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return "scontrol is not on this machine: Slurm is not installed"
    except subprocess.TimeoutExpired:
        return f"its controller does not answer (scontrol ping: no reply in {PING_TIMEOUT_S} s)"
    if "is UP" not in out.stdout:
        said = (out.stdout + out.stderr).strip().splitlines()
        return f"its controller does not answer (scontrol ping: {said[0] if said else 'nothing'})"
    return None


def local_slurm_refusal(cfg: Config) -> str | None:
    """The error for a job on the local Slurm while it is not running; None otherwise."""
    if cfg.cluster.name != LOCAL_CLUSTER:
        return None
    problem = local_slurm_problem()
    if problem is None:
        return None
    return (f"cluster '{LOCAL_CLUSTER}' is the local Slurm of this machine, and it is not "
            f"running ({problem}); {START_LOCAL}")
