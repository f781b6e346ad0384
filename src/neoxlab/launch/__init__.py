"""Launchers: local (mpiexec), emulated (mpiexec across network namespaces), lsf (bsub +
jsrun), slurm (sbatch + srun)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from neoxlab.config import Config
from neoxlab.launch import emulated, local, lsf, slurm

# Each module renders its job script, submits it (SUBMIT), and knows its LIVE_STATES.
SCHEDULERS: dict[str, ModuleType] = {"lsf": lsf, "slurm": slurm}


def scheduler_module(scheduler: str) -> ModuleType:
    """The module that renders, submits and queries jobs of a batch scheduler."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"no batch scheduler module for '{scheduler}'")
    return SCHEDULERS[scheduler]


def run_here(cfg: Config, run_dir: Path) -> int:
    """Run a job on this machine to its end: plain mpiexec, or across an emulated cluster's
    network namespaces when the cluster config has one."""
    if cfg.cluster.emulated is not None:
        return emulated.launch(cfg, run_dir)
    return local.launch(cfg, run_dir)
