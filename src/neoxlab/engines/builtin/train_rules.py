"""Training config rules, checked before any rank starts: the data file and checkpointing.
Each problem names the value, the rule and the fix (commands/check.py gathers them)."""

from __future__ import annotations

from pathlib import Path

from neoxlab.config import Config
from neoxlab.engines.builtin.data import corpus_files


def validate_data(cfg: Config) -> list[str]:
    """A builtin training run's data.path exists, is readable and holds two windows,
    checked before any rank starts, for ranks that run on this machine (on a cluster the
    path is the cluster's: the ranks check it there; engine=neox's data prefix:
    engines/neox/rules.py)."""
    d = cfg.data
    if d.source != "file" or not d.path:
        return []  # data.source and a missing data.path are layout.validate's rules
    path, need = Path(str(d.path)).expanduser(), 2 * cfg.model.seq_length + 1
    fix = f"give a readable text file or folder of at least {need} bytes"
    if not path.exists():
        return [f"data.path={path} does not exist; {fix}"]
    try:
        files = corpus_files(d)
        size = 0
        for file in files:
            with file.open("rb") as f:  # opened, not stat-ed: a permission problem shows here
                size += len(f.read(max(0, min(need, d.max_bytes) - size)))
    except OSError as exc:
        return [f"data.path={path} cannot be read ({exc.strerror}: {exc.filename}); {fix}"]
    if size == 0:
        return [f"data.path={path} is empty; {fix}"]
    usable = min(size, d.max_bytes)
    if usable < need:
        return [
            f"data.path={path} gives {usable} bytes (data.max_bytes={d.max_bytes}), fewer than "
            f"two windows of model.seq_length={cfg.model.seq_length} need ({need}); {fix}"
        ]
    return []


def validate_checkpointing(cfg: Config, world: int) -> list[str]:
    """Checkpoint settings and their testing aids; each problem names value, rule and fix."""
    t, launch = cfg.train, cfg.launch
    errors = []
    if t.checkpoint_every < 0:
        errors.append(
            f"train.checkpoint_every={t.checkpoint_every} is negative; use 0 (no periodic "
            "checkpoints) or a number of steps between checkpoints"
        )
    if t.keep_checkpoints < 1:
        errors.append(
            f"train.keep_checkpoints={t.keep_checkpoints} must be >= 1: resuming needs the "
            "newest complete checkpoint; use 1 or more"
        )
    h = launch.hold_step
    if h is not None and not 1 <= h < t.steps:
        errors.append(
            f"launch.hold_step={h} is not a step before the last (1..{t.steps - 1} for "
            f"train.steps={t.steps}); pick one of them or null"
        )
    k = launch.kill_during_checkpoint
    if k is not None:
        every = t.checkpoint_every
        if every <= 0 or k < 1 or k % every or k > t.steps:
            errors.append(
                f"launch.kill_during_checkpoint={k} is not a checkpoint step (multiples of "
                f"train.checkpoint_every={every} up to train.steps={t.steps}); pick one of them"
            )
        if not 0 <= launch.kill_rank < world:
            errors.append(
                f"launch.kill_rank={launch.kill_rank} is not a rank of the {world}-rank job; "
                f"use 0..{world - 1}"
            )
    return errors
