"""Node-side steps of a cluster job script, around the ranks:

    python -m neoxlab.launch.jobstep begin <run_dir>         # hostfile, job id, status
    python -m neoxlab.launch.jobstep end <run_dir> <exit>     # final status from the evidence

On a cluster nobody watches the ranks from the login node, so the job itself records how
it ended, with the same diagnosis the local launcher uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from neoxlab.config import Config
from neoxlab.engines.registry import engine_of
from neoxlab.launch import hostfile, manifest
from neoxlab.launch.attempt import clear_previous_attempt
from neoxlab.launch.failure import diagnose
from neoxlab.launch.schedulers import scheduler_of
from neoxlab.launch.submit import submit_and_record
from neoxlab.run import rundir


def job_id(env: dict[str, str]) -> str | None:
    return env.get("LSB_JOBID") or env.get("SLURM_JOB_ID")


def begin(run_dir: Path, env: dict[str, str]) -> None:
    cfg = rundir.load_config(run_dir)
    clear_previous_attempt(run_dir)  # e.g. the stop request the previous job obeyed
    try:
        hosts = scheduler_of(cfg).hosts(env)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        hosts = []  # only for tools that want a hostfile; the ranks do not need one
        print(f"[neoxlab] no hostfile: {exc}", file=sys.stderr)
    else:
        rundir.write_atomic(run_dir / "hostfile",
                            hostfile.format_hostfile(hosts, cfg.cluster.ranks_per_node))
    rundir.set_status(run_dir, rundir.State.STARTING, job_id=job_id(env), hosts=hosts)


def end(run_dir: Path, code: int) -> None:
    cfg = rundir.load_config(run_dir)
    after_job = engine_of(cfg).after_job
    if after_job is not None:
        after_job(run_dir)
    state = rundir.read_json(run_dir / "status.json").get("state")
    if state == "preempted":  # the ranks checkpointed on the pre-walltime signal
        requeue(cfg, run_dir)
        return
    if code == 0:
        if state != "completed":
            rundir.set_status(run_dir, rundir.State.COMPLETED, exit_code=0)
        return
    logs = sorted((run_dir / "logs").glob("job.*.err"))
    launcher_output = logs[-1].read_text(errors="replace") if logs else ""
    rundir.set_status(run_dir, rundir.State.FAILED, exit_code=code,
                      **diagnose(run_dir, launcher_output, code))


def requeue(cfg: Config, run_dir: Path) -> None:
    """Resubmit the same job script (it resumes from the run dir) while launch.requeue allows;
    every job id of the run goes into the manifest."""
    results = run_dir.parent.parent
    jobs = [e for e in manifest.read(results, cfg.experiment) if e.get("run_id") == run_dir.name]
    if len(jobs) > cfg.launch.requeue:
        rundir.set_status(run_dir, rundir.State.PREEMPTED, requeue_left=0, error=(
            f"stopped at the time limit after {len(jobs)} jobs (launch.requeue="
            f"{cfg.launch.requeue}); continue with `make resume RUN={run_dir}`"))
        return
    # "requeued" is recorded before submitting: the new job may start (and record its own
    # state) before this one ends
    left = cfg.launch.requeue - len(jobs)
    rundir.set_status(run_dir, rundir.State.REQUEUED, requeue_left=left)
    job_id = submit_and_record(
        cfg, run_dir, rundir.State.PREEMPTED,
        f"requeue failed: {{exc}}; continue with `make resume RUN={run_dir}`",
        requeue_of=jobs[-1]["job_id"] if jobs else None)
    if job_id is None:
        return
    print(f"[neoxlab] requeued as job {job_id} ({left} requeue(s) left after it)",
          file=sys.stderr)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("begin", "end"):
        print("usage: python -m neoxlab.launch.jobstep begin|end <run_dir> [exit_code]",
              file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    if argv[0] == "begin":
        begin(run_dir, dict(os.environ))
    else:
        end(run_dir, int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
