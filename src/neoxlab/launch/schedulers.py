"""The scheduler registry: every way a job starts, one record each, named by a cluster
config's `cluster.scheduler`.

Two kinds: a job that runs here to its end while the command waits (local: mpiexec;
emulated: the same ranks across network namespaces), and a job script handed to a batch
queue (lsf, slurm), which renders, submits, polls and cancels. The commands (run, resume,
status) and the cluster rules ask the record and never compare its name. A new cluster is
a YAML file under configs/cluster/; a new scheduler is a module beside lsf.py and slurm.py
and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neoxlab.config import Config
from neoxlab.launch import hostfile, local, lsf, slurm
from neoxlab.launch.emulated import launch as emulated
from neoxlab.registry import Registry
from neoxlab.run.rankjob import RankProgram


def _none(cfg: Config) -> list[str]:
    return []


def _no_job(job_id: str) -> str:
    return "-"  # a job run here has no scheduler job to ask about


@dataclass(frozen=True)
class Scheduler:
    # the commands that can start its ranks (cluster.launcher), each with what it is
    launchers: dict[str, str]
    rules: Callable[[Config], list[str]] = _none  # its own config rules (value, rule, fix)
    # why this machine cannot start (or submit) the job now, checked before anything is
    # planned (e.g. the local Slurm is down; namespaces need root)
    problems: Callable[[Config], list[str]] = _none
    # a job run here to its end: (config, run dir, the task's rank program) -> exit code
    launch: Callable[[Config, Path, RankProgram], int] | None = None
    # a batch queue: the job script's name in the run dir, the command that submits it
    script_name: str = ""
    submit_command: str = ""
    write_script: Callable[[Config, Path, RankProgram], Path] | None = None
    submit: Callable[[Path], str] | None = None  # the script -> the job id
    job_state: Callable[[str], str] = _no_job  # the scheduler's word for a job's state
    live_states: tuple[str, ...] = ()  # states in which the job may still run
    cancel: Callable[[str], None] | None = None
    hosts: Callable[[dict[str, str]], list[str]] | None = None  # the job's hosts, in the job
    emulates: bool = False  # builds the nodes and links that cluster.emulated describes

    @property
    def runs_here(self) -> bool:
        """The job runs on this machine while the command waits: its results exist when the
        command returns, and its ranks' pids say whether it still runs."""
        return self.launch is not None


SCHEDULERS: Registry[Scheduler] = Registry("cluster.scheduler", "neoxlab/launch/schedulers.py", {
    "local": Scheduler(launchers={"mpiexec": ""}, launch=local.launch),
    "emulated": Scheduler(launchers=emulated.LAUNCHERS, problems=emulated.problems,
                          launch=emulated.launch, emulates=True),
    "lsf": Scheduler(launchers={"jsrun": ""}, rules=lsf.rules, script_name=lsf.SCRIPT_NAME,
                     submit_command=lsf.SUBMIT, write_script=lsf.write_script,
                     submit=lsf.submit, job_state=lsf.job_state, live_states=lsf.LIVE_STATES,
                     cancel=lsf.cancel, hosts=hostfile.lsf_hosts),
    "slurm": Scheduler(launchers={"srun": ""}, rules=slurm.rules, problems=slurm.problems,
                       script_name=slurm.SCRIPT_NAME, submit_command=slurm.SUBMIT,
                       write_script=slurm.write_script, submit=slurm.submit,
                       job_state=slurm.job_state, live_states=slurm.LIVE_STATES,
                       cancel=slurm.cancel, hosts=hostfile.slurm_hosts),
})


def scheduler_of(cfg: Config) -> Scheduler:
    """The record of the config's scheduler; ConfigError naming the known ones otherwise."""
    return SCHEDULERS[cfg.cluster.scheduler]
