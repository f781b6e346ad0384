"""The batch schedulers a cluster config can name, each a module that renders its job script,
submits it (SUBMIT) and knows its LIVE_STATES."""

from __future__ import annotations

from types import ModuleType

from neoxlab.launch import lsf, slurm

SCHEDULERS: dict[str, ModuleType] = {"lsf": lsf, "slurm": slurm}


def scheduler_module(scheduler: str) -> ModuleType:
    """The module that renders, submits and queries jobs of a batch scheduler."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"no batch scheduler module for '{scheduler}'")
    return SCHEDULERS[scheduler]
