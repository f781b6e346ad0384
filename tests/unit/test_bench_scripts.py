"""`make bench` runs every bench/*.py as it is on a fresh clone: each must at least start (its
imports resolve from the installed package, not from another script's folder) and answer
--help; the GPU checks and per-rank programs live in subfolders that `make bench` skips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_make_bench_has_timing_benchmarks_to_run():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_starts_on_a_fresh_clone(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=BENCH.parent, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_no_benchmark_needs_a_gpu_or_a_study_s_output():
    """GPU checks are under bench/device/ and sweeps' tables under studies/: a benchmark that
    names either would fail on a fresh CPU clone."""
    for script in SCRIPTS:
        text = script.read_text()
        assert "studies/" not in text and ".sweep.csv" not in text, script.name
        assert "device_check" not in text, script.name
