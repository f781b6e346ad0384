"""Run a job on this machine to its end: plain mpiexec, or across an emulated cluster's
network namespaces when the cluster config has one (used by run and resume alike)."""

from __future__ import annotations

from pathlib import Path

from neoxlab.config import Config
from neoxlab.launch import local
from neoxlab.launch.emulated import launch as emulated


def run_here(cfg: Config, run_dir: Path) -> int:
    if cfg.cluster.emulated is not None:
        return emulated.launch(cfg, run_dir)
    return local.launch(cfg, run_dir)
