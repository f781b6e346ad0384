"""Continue a training run: `python -m neoxlab resume <run_dir>` (make resume RUN=...);
`python -m neoxlab.commands.resume <run_dir>` does the same without neoxlab.__main__'s spare.

Relaunches the ranks on the same run dir (never a new one): locally with mpiexec, or, for a
cluster run, by resubmitting the run dir's job script from the login node. The ranks resume
by themselves from the newest usable checkpoint in it (see
neoxlab.engines.builtin.program). The checks here only refuse what cannot or need
not be resumed, before anything starts.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from neoxlab.commands.check import check, exit_on_config_error
from neoxlab.commands.status import live_ranks, report
from neoxlab.config import Config, ConfigError
from neoxlab.engines.builtin.reporting import metrics_up_to
from neoxlab.engines.registry import engine_of, not_resumable
from neoxlab.launch.manifest import read as read_manifest
from neoxlab.launch.schedulers import Scheduler, scheduler_of
from neoxlab.launch.submit import submit_from_login
from neoxlab.run import rundir
from neoxlab.tasks import TASKS

USAGE = "usage: python -m neoxlab resume <run_dir>   (make resume RUN=results/<exp>/<run_id>)"


def check_resumable(run_dir: Path) -> Config:
    """The run's config, or ConfigError saying why this dir cannot be resumed here."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory; give a run dir, "
                          "e.g. make resume RUN=results/<experiment>/<run_id>")
    missing = [n for n in ("config.json", "status.json") if not (run_dir / n).is_file()]
    if missing:
        raise ConfigError(
            f"{run_dir} is not a run dir (no {' or '.join(missing)}); give a directory that "
            "`make run` created: results/<experiment>/<run_id>"
        )
    cfg = rundir.load_config(run_dir)
    check(cfg)  # a config.json edited into an invalid one is refused here
    kind = not_resumable(cfg, TASKS[cfg.task.name].trains)
    if kind is not None:
        raise ConfigError(
            f"{run_dir} is {kind}; only training runs (builtin or neox) have checkpoints to "
            "resume; start a new run with make run"
        )
    scheduler = scheduler_of(cfg)
    if scheduler.runs_here:
        alive = live_ranks(run_dir)
        if alive:
            raise ConfigError(f"{run_dir} is still running (rank pids {alive}); wait for it "
                              "to end or stop it first")
    else:
        check_no_live_job(cfg, run_dir, scheduler)
    status = rundir.read_json(run_dir / "status.json")
    if status.get("state") == "completed":  # a failure after the last step is not complete
        done, _ = metrics_up_to(run_dir / "metrics.jsonl", cfg.train.steps)
        raise ConfigError(
            f"{run_dir} already completed all {cfg.train.steps} steps ({len(done)} in "
            "metrics.jsonl); nothing to resume (start a new run with make run, e.g. with a "
            "larger train.steps)"
        )
    return cfg


def check_no_live_job(cfg: Config, run_dir: Path, scheduler: Scheduler) -> None:
    """A cluster run's newest job must have ended, and this machine must be able to submit."""
    problems = scheduler.problems(cfg)  # e.g. this machine's own Slurm, not started
    if problems:
        raise ConfigError(f"{run_dir}: {'; '.join(problems)}")
    if shutil.which(scheduler.submit_command) is None:
        raise ConfigError(
            f"{run_dir} ran on cluster '{cfg.cluster.name}', which submits with "
            f"{scheduler.submit_command}; not on this machine: run make resume on its login "
            "node"
        )
    jobs = [e for e in read_manifest(run_dir.parent.parent, cfg.experiment)
            if e.get("run_id") == run_dir.name and e.get("job_id")]
    if jobs:
        state = scheduler.job_state(jobs[-1]["job_id"])
        if state.split()[0] in scheduler.live_states:
            raise ConfigError(f"{run_dir}: its job {jobs[-1]['job_id']} is {state}; wait for "
                              "it to end (or cancel it) before resuming")


def resubmit(cfg: Config, run_dir: Path) -> int:
    """Submit the run dir's own job script again; its ranks resume from the checkpoints."""
    rundir.set_status(run_dir, rundir.State.SUBMITTED, resumed=True)
    return submit_from_login(cfg, run_dir, "resubmitted as", "resubmission failed: {exc}",
                             resumed=True)


def plan_line(run_dir: Path, cfg: Config) -> str:
    step = engine_of(cfg).resume_step(run_dir)
    if step is not None:
        where = f"from the checkpoint after step {step} of {cfg.train.steps}"
    else:
        where = f"from step 0 of {cfg.train.steps} (no usable checkpoint)"
    return f"[neoxlab] resuming {run_dir} {where}"


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = Path(args[0]).resolve()
    return exit_on_config_error(lambda: resume(run_dir))


def resume(run_dir: Path) -> int:
    cfg = check_resumable(run_dir)
    print(plan_line(run_dir, cfg), flush=True)
    scheduler = scheduler_of(cfg)
    if not scheduler.runs_here:
        return resubmit(cfg, run_dir)
    code = scheduler.launch(cfg, run_dir, TASKS[cfg.task.name].program)
    report(run_dir)
    return code


if __name__ == "__main__":
    sys.exit(main())
