"""What every rank runs and with which environment, the same for mpiexec, jsrun and srun: the
engine's command for the task's rank program (handed over by the commands), and the
engine's variables."""

from __future__ import annotations

from pathlib import Path

from neoxlab.comm.scheme import mpi_affinity_environment
from neoxlab.config import Config
from neoxlab.engines.registry import engine_of
from neoxlab.run.rankjob import RankProgram


def rank_command(cfg: Config, run_dir: Path, python: str, program: RankProgram) -> list[str]:
    return engine_of(cfg).rank_command(cfg, run_dir, python, program.module)


def rank_env(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Variables the ranks need on top of the site's environment: the engine's, and what
    the cluster's MPI library needs whatever the engine (MVAPICH's affinity off)."""
    return {**engine_of(cfg).rank_env(cfg, run_dir), **mpi_affinity_environment(cfg)}
