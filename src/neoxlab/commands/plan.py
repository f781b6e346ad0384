"""Freeze a checked config into a new run dir and add its task's files (e.g. deepspeed.json)."""

from __future__ import annotations

import sys
from pathlib import Path

from neoxlab.comm.compression_rules import codec_kernel_warning
from neoxlab.config import Config
from neoxlab.files import free_bytes, gib
from neoxlab.layout import Layout, total_params
from neoxlab.run import rundir
from neoxlab.tasks import TASKS


def plan_run(cfg: Config, layout: Layout, argv: list[str] | None = None,
             root: Path | None = None) -> Path:
    """The run dir of a config that commands.check.check passed (layout is what it returned):
    every rule ran before, so nothing is checked again here."""
    run_dir = rundir.freeze(cfg, layout, argv, root)
    hook = TASKS[cfg.task.name].plan
    if hook is not None:
        hook(cfg, layout, run_dir)
    for warning in (checkpoint_space_warning(cfg, run_dir), codec_kernel_warning(cfg)):
        if warning:
            print(f"[neoxlab] warning: {warning}", file=sys.stderr, flush=True)
    return run_dir


def checkpoint_bytes(cfg: Config) -> int:
    """One checkpoint of every rank: weights plus optimizer states (fp32 master and Adam
    moments), summed over the model (ZeRO and TP/PP split them but keep the sum)."""
    half = cfg.train.precision in ("fp16", "bf16")
    return total_params(cfg.model) * ((2 + 12) if half else (4 + 8))


def checkpoint_space_warning(cfg: Config, run_dir: Path) -> str | None:
    """Checkpoints kept (plus the one being written) against the run dir's free space."""
    if cfg.train.checkpoint_every <= 0 or not TASKS[cfg.task.name].trains:
        return None
    need = checkpoint_bytes(cfg) * (cfg.train.keep_checkpoints + 1)
    free = free_bytes(run_dir)
    if free >= need:
        return None
    return (f"{run_dir} has {gib(free)} free, but train.keep_checkpoints="
            f"{cfg.train.keep_checkpoints} checkpoints (+1 while writing) need about {gib(need)}; "
            "free space, keep fewer checkpoints or set launch.results_dir to a larger disk")
