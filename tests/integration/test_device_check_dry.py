"""bench/device/device_check.sh, the acceptance run for a lent GPU, as a CPU dry run
(DEVICE_CHECK_DRY=1): every Python part runs, from empty Triton and torch-extension caches
as on a fresh GPU machine, so a typo cannot waste the one GPU run; its time limits, set-up
and cache warm-up included, add up to less than the 480 s a device run may take; and on a
machine without a GPU the real run stops at once, saying so.

CI time: the dry run took 72 s of CPU on 2026-12-07 (user 64 s + system 8 s; 78 s wall,
docs/measurements/2026-12-07-ci.md), a third of it the native decode attention built from
an empty cache in section 0. The no-GPU check takes seconds."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "device" / "device_check.sh"
SECTIONS = 8  # numbered 1-8 after section 0, the set-up
# no line anchor: four processes share the pipe, so a tally may follow another's text
RANK_TALLY = re.compile(r"rank (\d): (\d+) checks passed, (\d+) failed")


def test_time_limits_add_up_to_less_than_480_s():
    text = SCRIPT.read_text()
    limits = [int(t) for t in re.findall(r"^\s*(?:if ! )?limit (\d+) ", text, re.M)]
    # the no-GPU check, the wheels' install, the warm-up, and sections 1-8
    assert len(limits) == SECTIONS + 3
    assert sum(limits) < 480, limits
    # everything runs under a limit: no bare timeout or unlimited Python part
    assert not re.findall(r"^\s*timeout \d", text, re.M)
    assert not re.findall(r'^\s*"\$PY" ', text, re.M)
    assert len(re.findall(r'^\s*(?:if ! )?limit \d+ "\$PY" ', text, re.M)) == SECTIONS + 2


def test_without_a_gpu_the_device_run_stops_at_once(tmp_path):
    env = {"PATH": f"{REPO_ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
           "DEVICE_CHECK_PYTHON": sys.executable, "OUT": str(tmp_path),
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                         cwd=REPO_ROOT, env=env, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "device_check: no CUDA device" in text and "DEVICE_CHECK_DRY=1" in text
    assert "== 0." not in text and "== 1." not in text  # nothing installed, nothing ran


@pytest.mark.timeout(900)
def test_the_dry_run_passes_every_section(tmp_path):
    env = {"PATH": f"{REPO_ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "DEVICE_CHECK_DRY": "1",
           "DEVICE_CHECK_PYTHON": sys.executable, "OUT": str(tmp_path),
           "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=800,
                         cwd=REPO_ROOT, env=env, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    for n in range(SECTIONS + 1):
        assert f"== {n}." in text
    assert "warm_caches: OK" in text and "native decode attention: " in text
    assert "device_check_collectives: OK" in text and "sync_check: OK" in text
    assert text.count("through the patch: ") == 3  # int8, zfp, mpc via CompressionPatch
    assert re.search(r"== device_check: OK \(the whole run, set-up included: \d+ s\)", text)
    memory = (tmp_path / "op_memory.txt").read_text()
    for codec in ("int8", "zfp", "mpc", "topk"):
        assert memory.count(f"\n{codec}") >= 9, codec  # every op, within its bound
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
