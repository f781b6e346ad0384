"""MPICH's shared-memory segments (/dev/shm/mpich_shm_*) that a failed job leaves behind.

A rank that ends without MPI_Finalize (an exception, a kill, a timeout) leaves its node's
segment, a few MB of RAM each, in /dev/shm for good: a machine that runs many failing jobs
fills its memory with them (371 segments, 1.2 GB, were found on this one). The launcher
notes the segments before a job and, once the job has ended, removes the new ones that no
live process has open or mapped, so a concurrent job's segments stay.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "mpich_shm_"


def segments(shm_dir: Path = SHM_DIR) -> set[str]:
    """The names of MPICH's segments there now."""
    with contextlib.suppress(OSError):
        return {p.name for p in shm_dir.iterdir() if p.name.startswith(PREFIX)}
    return set()


def in_use(shm_dir: Path = SHM_DIR) -> set[str]:
    """Segment names that some live process has open or mapped."""
    marker = f"{shm_dir}/{PREFIX}"

    def name(path: str) -> str | None:  # "<dir>/mpich_shm_x_0[ (deleted)]" -> "mpich_shm_x_0"
        return path[len(shm_dir.as_posix()) + 1:].split()[0] if path.startswith(marker) else None

    found: set[str | None] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (line.split(maxsplit=5) for line in (proc / "maps").read_text().splitlines())
            found.update(name(f[5]) for f in fields if len(f) == 6)
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    found.add(name(os.readlink(fd)))
    return {n for n in found if n is not None}


def remove_stale(before: set[str], shm_dir: Path = SHM_DIR, wait_s: float = 0.0
                 ) -> list[str]:
    """Remove the segments made since `before` that nothing uses any more; their names.
    wait_s: for up to this long, also those whose users are still exiting (killed ranks)."""
    deadline = time.monotonic() + wait_s
    removed: list[str] = []
    while new := segments(shm_dir) - before:
        stale = _remove(new - in_use(shm_dir), shm_dir)
        removed += stale
        if time.monotonic() >= deadline or len(stale) == len(new):
            break
        time.sleep(0.2)  # poll: the ranks' exit is not ours to wait on
    return removed


def remove_abandoned(min_age_s: float = 60.0, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove segments nothing uses that are older than `min_age_s` (a segment a starting
    job has just made is younger): a killed job's. A job that reuses the name (the same
    Slurm job id) would fail in MPI_Init on it."""
    now = time.time()
    old = set()
    for name in segments(shm_dir):
        with contextlib.suppress(OSError):
            if now - (shm_dir / name).stat().st_mtime > min_age_s:
                old.add(name)
    return _remove(old - in_use(shm_dir), shm_dir) if old else []


def _remove(names: set[str], shm_dir: Path) -> list[str]:
    """Unlink these segments (one gone already is fine); their names, sorted."""
    for name in names:
        with contextlib.suppress(OSError):
            (shm_dir / name).unlink()
    return sorted(names)
