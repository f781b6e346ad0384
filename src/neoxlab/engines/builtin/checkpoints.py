"""Checkpoint directories of a run: naming, the completion marker, discovery and pruning.

Pure file-system logic (no torch), shared by the ranks and by `make resume` (run.resume).

    checkpoints/step<N>/                   DeepSpeed's files (save_checkpoint, tag step<N>)
    checkpoints/step<N>/neoxlab/rank<R>.pt each rank's own state (RNG, residuals, data)
    checkpoints/step<N>/complete.json      written last, by rank 0, once every rank finished
                                           writing: the commit

A checkpoint counts only with its marker, and only while every file the marker lists still
has the size it had when the marker was written (a truncated file makes it unusable).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from neoxlab.files import now
from neoxlab.run import rundir

CHECKPOINTS = "checkpoints"
MARKER = "complete.json"
RANK_STATE_DIR = "neoxlab"
_PREFIX = "step"


def root(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS


def tag(step: int) -> str:
    """DeepSpeed's tag and the directory name of the checkpoint after `step` steps."""
    return f"{_PREFIX}{step}"


def step_of(name: str) -> int | None:
    """The step a checkpoint directory name stands for; None for anything else."""
    digits = name.removeprefix(_PREFIX)
    if name == digits or not digits.isdigit():
        return None
    return int(digits)


def rank_state_path(run_dir: Path, step: int, rank: int) -> Path:
    return root(run_dir) / tag(step) / RANK_STATE_DIR / f"rank{rank}.pt"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    problem: str | None  # why it cannot be used; None when usable

    @property
    def usable(self) -> bool:
        return self.problem is None


def file_sizes(path: Path) -> dict[str, int]:
    """Every file of a checkpoint (relative path -> bytes), the marker and temp files aside."""
    files = {}
    for file in sorted(path.rglob("*")):
        if file.is_file() and file.name != MARKER and not file.name.startswith("."):
            files[file.relative_to(path).as_posix()] = file.stat().st_size
    return files


def write_marker(path: Path, step: int, world_size: int) -> None:
    """Commit a checkpoint: only call once every rank has finished writing its files."""
    rundir.write_json(path / MARKER, {
        "step": step, "world_size": world_size, "files": file_sizes(path),
        "time": now(),
    })


def check(path: Path, step: int) -> str | None:
    """Why the checkpoint at `path` is unusable, or None when it is complete and intact."""
    marker = path / MARKER
    if not marker.is_file():
        return "no completion marker (a rank did not finish writing it)"
    try:
        meta = rundir.read_json(marker)
        files = dict(meta["files"])
        marked_step = int(meta["step"])
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"unreadable completion marker ({type(exc).__name__}: {exc})"
    if marked_step != step:
        return f"its marker names step {marked_step}, not {step}"
    if not files:
        return "its marker lists no files"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"file {name} is missing"
        actual = file.stat().st_size
        if actual != size:
            return f"file {name} has {actual} bytes, {size} when written (truncated)"
    return None


def scan(run_dir: Path) -> list[Checkpoint]:
    """Every checkpoint directory of the run, newest first, each with its problem if any."""
    base = root(run_dir)
    if not base.is_dir():
        return []
    found = []
    for path in base.iterdir():
        step = step_of(path.name)
        if step is not None and path.is_dir():
            found.append(Checkpoint(step, path, check(path, step)))
    return sorted(found, key=lambda c: c.step, reverse=True)


def usable(found: list[Checkpoint]) -> list[Checkpoint]:
    return [c for c in found if c.usable]


def skipped_newer(found: list[Checkpoint], chosen_step: int) -> list[Checkpoint]:
    """The unusable checkpoints newer than the one resumed from: each deserves a warning."""
    return [c for c in found if not c.usable and c.step > chosen_step]


def describe(c: Checkpoint) -> str:
    return f"checkpoint {c.path} skipped: {c.problem}"


def to_prune(found: list[Checkpoint], keep: int) -> list[Checkpoint]:
    """What to delete once a new checkpoint is committed: usable ones beyond the newest
    `keep`, and anything (unusable leftovers of crashed writes) older than the newest one."""
    good = usable(found)
    if not good:
        return []
    kept = {c.step for c in good[:keep]}
    newest = good[0].step
    return [c for c in found if c.step not in kept and c.step < newest]


def prune(run_dir: Path, keep: int) -> list[Path]:
    removed = []
    for c in to_prune(scan(run_dir), keep):
        shutil.rmtree(c.path, ignore_errors=True)
        removed.append(c.path)
    return removed
