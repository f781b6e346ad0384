"""status.json on a full disk: the atomic writer's temporary file gets no block, so the new
state is written over the file's own blocks and every reader sees it; the disk-full error is
still raised (the caller's one line) and says what was kept."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from neoxlab.files import disk_full
from neoxlab.run import rundir

_write_text = Path.write_text


def no_new_blocks(monkeypatch, err: int = errno.ENOSPC) -> None:
    """Temporary files (the atomic writer's) cannot be written; files in place still can."""
    def write_text(self: Path, data: str, *args, **kwargs) -> int:
        if self.name.endswith(".tmp"):
            raise OSError(err, os.strerror(err))
        return _write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.fixture
def running(tmp_path) -> Path:
    rundir.set_status(tmp_path, rundir.State.PLANNED)
    rundir.begin_attempt(tmp_path)
    rundir.set_status(tmp_path, rundir.State.RUNNING, world_size=4)
    return tmp_path


def test_a_failed_run_on_a_full_disk_reads_failed(running, monkeypatch):
    no_new_blocks(monkeypatch)
    with pytest.raises(OSError) as raised:
        rundir.set_status(running, rundir.State.FAILED, failed_rank=2, error="rank 2 died")
    status = rundir.read_json(running / "status.json")
    assert (status["state"], status["failed_rank"], status["error"]) == ("failed", 2, "rank 2 died")
    assert status["world_size"] == 4 and len(status["attempts"]) == 1  # nothing else lost
    line = disk_full(raised.value)
    assert line is not None and "status.json was rewritten in place: state failed" in line
    assert not list(running.glob(".*.tmp"))


def test_the_attempt_closes_on_a_full_disk_too(running, monkeypatch):
    no_new_blocks(monkeypatch)
    with pytest.raises(OSError):
        rundir.end_attempt(running, 1, "rank 2: rank 2 died")
    (attempt,) = rundir.read_json(running / "status.json")["attempts"]
    assert (attempt["exit"], attempt["reason"]) == (1, "rank 2: rank 2 died")


def test_a_record_larger_than_the_file_keeps_the_state_and_drops_the_history(running,
                                                                              monkeypatch):
    path = running / "status.json"
    held = path.stat()
    room = max(held.st_size, held.st_blocks * 512)
    no_new_blocks(monkeypatch)
    error = "x" * (2 * room)  # the full record cannot fit in the blocks the file holds
    with pytest.raises(OSError) as raised:
        rundir.set_status(running, rundir.State.FAILED, error=error)
    status = rundir.read_json(path)
    assert status["state"] == "failed" and "attempts" not in status
    assert status["error"] == error[:rundir.STATUS_TEXT_IN_PLACE]
    assert "attempts left out" in disk_full(raised.value)


def test_other_write_errors_leave_the_file_alone(running, monkeypatch):
    no_new_blocks(monkeypatch, errno.EACCES)
    with pytest.raises(PermissionError):
        rundir.set_status(running, rundir.State.FAILED, error="rank 2 died")
    assert rundir.read_json(running / "status.json")["state"] == "running"
