"""What every rank of the builtin engine runs and with which environment (mpiexec, jsrun and
srun alike): the task's own rank program on this checkout's sources."""

from __future__ import annotations

from pathlib import Path

from neoxlab.comm.scheme import mpi_device_environment, mpi_environment
from neoxlab.config import Config
from neoxlab.files import REPO_ROOT


def rank_command(cfg: Config, run_dir: Path, python: str, task_module: str) -> list[str]:
    return [python, "-m", task_module, str(run_dir)]


def rank_env(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Variables the ranks need on top of the site's environment."""
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
