"""What every rank runs and with which environment, the same for mpiexec, jsrun and srun: the
engine's command for the task's rank program, and the engine's variables."""

from __future__ import annotations

from pathlib import Path

from neoxlab.comm.policy import mpi_affinity_environment
from neoxlab.config import Config
from neoxlab.engines.registry import engine_of
from neoxlab.tasks import TASKS


def rank_command(cfg: Config, run_dir: Path, python: str) -> list[str]:
    module = TASKS[cfg.task.name].rank_module
    assert module is not None, f"task '{cfg.task.name}' launches no ranks"
    return engine_of(cfg).rank_command(cfg, run_dir, python, module)


def rank_env(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Variables the ranks need on top of the site's environment: the engine's, and what
    the cluster's MPI library needs whatever the engine (MVAPICH's affinity off)."""
    return {**engine_of(cfg).rank_env(cfg, run_dir), **mpi_affinity_environment(cfg)}
