"""Compressed collectives on 4 real gloo ranks: exact where lossless, bounded where lossy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neoxlab.launch.local import mpiexec_path
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'src'}")
    proc = subprocess.run(
        [mpiexec_path(), "-n", "4", sys.executable,
         str(REPO_ROOT / "tests/integration/collectives_rank.py"), str(out)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


def test_none_and_mpc_are_bit_identical_to_plain_collectives(checks):
    exact_keys = [k for k in checks[0] if k.endswith("_exact")]
    assert len(exact_keys) >= 6
    for rank, c in enumerate(checks):
        for key in exact_keys:
            assert c[key] is True, (rank, key)
    assert checks[1]["send_recv_mpc_exact"] is True


def test_zfp_rate_8_shrinks_4x_with_bounded_error(checks):
    for c in checks:
        assert c["zfp_ratio"] == pytest.approx(4.0, rel=0.05)
        assert 0 < c["zfp_rel_error"] < 0.05


def test_error_feedback_keeps_the_running_sum_on_track(checks):
    for c in checks:
        assert c["ef_error"] < c["no_ef_error"] / 2, c
