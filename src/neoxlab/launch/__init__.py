"""Launchers: local (mpiexec), lsf (bsub + jsrun), slurm (sbatch + srun)."""

from __future__ import annotations

from types import ModuleType


def scheduler_module(scheduler: str) -> ModuleType:
    """The module that renders, submits and queries jobs of a batch scheduler."""
    if scheduler == "lsf":
        from neoxlab.launch import lsf

        return lsf
    if scheduler == "slurm":
        from neoxlab.launch import slurm

        return slurm
    raise ValueError(f"no batch scheduler module for '{scheduler}'")
