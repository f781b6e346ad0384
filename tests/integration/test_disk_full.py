"""A full disk under launch.results_dir (a 3 MB tmpfs): a warning before launch, then one
line naming the folder and its free space, a non-zero exit, no traceback, no rank left, and
status.json itself saying failed (written in place when no new block is left)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.harness import FOUR_RANKS, processes_of, read_status, run_experiment


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                              capture_output=True, text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def test_full_disk_ends_in_one_line_and_no_stale_running_state(tiny_disk):
    proc, run_dir = run_experiment("local_3d", tiny_disk, *FOUR_RANKS, "train.steps=10",
                                   "train.checkpoint_every=5", timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "[neoxlab] warning:" in proc.stderr and "free" in proc.stderr  # before launch
    errors = [line for line in proc.stderr.splitlines() if "[neoxlab] error:" in line]
    assert errors and "no space left on device" in errors[-1], proc.stderr[-3000:]
    assert "free" in errors[-1] and str(tiny_disk) in errors[-1]
    launcher_lines = [line for line in proc.stderr.splitlines()
                      if not line.startswith(("[rank", " "))]  # rank logs may hold their own
    assert not any(line.startswith("Traceback") for line in launcher_lines), proc.stderr[-3000:]
    assert not processes_of(run_dir)
    assert read_status(run_dir)["state"] == "failed"  # what every reader sees, not only status
    status = subprocess.run([sys.executable, "-m", "neoxlab.commands.status", "local_3d",
                             "--results", str(tiny_disk)], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120)
    row = [line for line in status.stdout.splitlines() if run_dir.name in line]
    assert row, status.stdout + status.stderr
    assert " running " not in f" {row[0]} ", row[0]
