"""bench/device/device_check.sh, the acceptance run for a lent GPU, as a CPU dry run
(DEVICE_CHECK_DRY=1): every Python part runs, so a typo cannot waste the one GPU run; and
its section time limits add up to less than the 480 s a device run may take."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "device" / "device_check.sh"
SECTIONS = 8
# no line anchor: four processes share the pipe, so a tally may follow another's text
RANK_TALLY = re.compile(r"rank (\d): (\d+) checks passed, (\d+) failed")


def test_section_timeouts_add_up_to_less_than_480_s():
    text = SCRIPT.read_text()
    limits = [int(t) for t in re.findall(r"^\s*limit (\d+) ", text, re.M)]
    assert len(limits) == SECTIONS
    assert sum(limits) < 480, limits
    # every section runs under its limit: no bare timeout or unlimited Python part
    assert not re.findall(r"^\s*timeout \d", text, re.M)
    assert len(re.findall(r'^\s*limit \d+ "\$PY" ', text, re.M)) == SECTIONS


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
    # host syncs forbidden on the fixed-rate path: every fp16 op ran in that mode
    assert (tmp_path / "sync_check.txt").read_text().count("error mode: ok") >= 5
    # the 4-process exchange: every rank ran its checks and none failed
    tallies = RANK_TALLY.findall((tmp_path / "exchange.txt").read_text())
    assert sorted(int(rank) for rank, _, _ in tallies) == [0, 1, 2, 3], tallies
    assert all(int(passed) > 100 and failed == "0" for _, passed, failed in tallies), tallies
    assert "exchange_check: OK" in text
    # the training run: finite losses and compressed DP all-reduces; then serving
    train = (tmp_path / "runs.txt").read_text()
    assert "train_step: OK" in train
    assert int(re.search(r"'compressed_calls': (\d+)", train).group(1)) > 0
    assert "serve_device: OK" in train and "fused: 10/10" in train
