"""bench/device/device_check.sh, the acceptance run for a lent GPU, as a CPU dry run
(DEVICE_CHECK_DRY=1): every Python part runs, so a typo cannot waste the one GPU run; and
its section timeouts add up to less than the 480 s a device run may take."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "device" / "device_check.sh"
SECTIONS = 5


def test_section_timeouts_add_up_to_less_than_480_s():
    timeouts = [int(t) for t in re.findall(r"^\s*timeout (\d+) ", SCRIPT.read_text(), re.M)]
    assert len(timeouts) == SECTIONS
    assert sum(timeouts) < 480, timeouts


@pytest.mark.timeout(900)
def test_the_dry_run_passes_every_section(tmp_path):
    env = {"PATH": f"{REPO_ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "DEVICE_CHECK_DRY": "1",
           "DEVICE_CHECK_PYTHON": sys.executable, "OUT": str(tmp_path),
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=800,
                         cwd=REPO_ROOT, env=env, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    for n in range(1, SECTIONS + 1):
        assert f"== {n}." in text
    assert "device_check_collectives: OK" in text and "sync_check: OK" in text
    assert "== device_check: OK" in text
    assert (tmp_path / "op_memory.txt").read_text().count("\n") > 10
