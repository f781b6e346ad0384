"""What every rank runs and with which environment, the same for mpiexec, jsrun and srun."""

from __future__ import annotations

from pathlib import Path

from neoxlab.comm.policy import mpi_device_environment, mpi_environment
from neoxlab.config import Config
from neoxlab.files import REPO_ROOT
from neoxlab.neox import launch as neox
from neoxlab.tasks import TASKS


def rank_command(cfg: Config, run_dir: Path, python: str) -> list[str]:
    if cfg.engine.name == "neox":
        return neox.rank_command(cfg, run_dir, python)
    return [python, "-m", TASKS[cfg.task.name].rank_module, str(run_dir)]


def rank_env(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Variables the ranks need on top of the site's environment."""
    if cfg.engine.name == "neox":
        return neox.rank_env(cfg, run_dir)
    env = {
        "OMP_NUM_THREADS": str(cfg.engine.torch_threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO_ROOT / "src"),
    }
    if cfg.cluster.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    env.update(mpi_environment(cfg.compression))  # only when the MPI library compresses
    env.update(mpi_device_environment(cfg))  # only when it is handed CUDA tensors
    return env
