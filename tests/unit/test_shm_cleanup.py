"""After a job, MPICH segments it left in /dev/shm go; segments some process still has open
or mapped (a concurrent job's) stay, and so do those that were there before."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

import pytest

from neoxlab.launch import shm

pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm here")


def _segment(tag: str) -> Path:
    path = shm.SHM_DIR / f"{shm.PREFIX}neoxlabtest{tag}{uuid.uuid4().hex[:8]}_0"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


def test_only_new_segments_that_nothing_uses_are_removed():
    older = _segment("older")
    before = shm.segments()
    stale, mapped, held = _segment("stale"), _segment("mapped"), _segment("held")
    fd = os.open(held, os.O_RDONLY)  # open, as a rank that has not mapped it yet
    with mapped.open("r+b") as f, mmap.mmap(f.fileno(), 0) as _view:
        f.close()  # mapped only, as a live rank's segment
        try:
            removed = shm.remove_stale(before)
            assert stale.name in removed and not stale.exists()
            assert mapped.exists() and held.exists() and older.exists()
            assert {mapped.name, held.name} <= shm.in_use()
        finally:
            os.close(fd)
            for path in (older, stale, mapped, held):
                path.unlink(missing_ok=True)


def test_abandoned_segments_go_and_young_or_used_ones_stay():
    abandoned, young, mapped = _segment("abandoned"), _segment("young"), _segment("mapped")
    hour_ago = os.path.getmtime(abandoned) - 3600
    for path in (abandoned, mapped):
        os.utime(path, (hour_ago, hour_ago))
    with mapped.open("r+b") as f, mmap.mmap(f.fileno(), 0) as _view:
        try:
            removed = shm.remove_abandoned(min_age_s=60)
            assert abandoned.name in removed and not abandoned.exists()
            assert young.exists() and mapped.exists()
        finally:
            for path in (abandoned, young, mapped):
                path.unlink(missing_ok=True)
