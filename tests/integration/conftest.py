"""Fixtures for integration tests: `requires_slurm` skips (or, in CI, fails) without Slurm,
and the runs several test modules share. Each 8-rank launch costs most of its time in
start-up on a small machine, so one run per distinct layout/scheme serves every module that
asserts on it (session scope: made once, by the first test that needs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from neoxlab.comm.strict import STRICT_ENV
from tests.conftest import REPO_ROOT
from tests.integration.harness import (
    CHECKPOINT_EVERY,
    COMPARE_STEPS,
    TRAIN_STEPS,
    read_status,
    run_experiment,
)
from tests.integration.slurm import slurm_ready_cached


@pytest.fixture
def requires_slurm() -> None:
    """Skip with the reason when no Slurm controller/node answers; fail when CI requires it."""
    reason = slurm_ready_cached()
    if reason is None:
        return
    if os.environ.get("NEOXLAB_REQUIRE_SLURM") == "1":
        pytest.fail(f"NEOXLAB_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class CompareRun:
    """The default experiment (local_compare, four schemes on the 8-rank 3D layout) as a user
    starts it: `python -m neoxlab` with no experiment, in strict-device mode."""

    proc: subprocess.CompletedProcess
    results: Path

    def member(self, experiment: str) -> Path:
        (run_dir,) = (self.results / experiment).iterdir()
        return run_dir


@pytest.fixture(scope="session")
def compare_run(tmp_path_factory) -> CompareRun:
    results = tmp_path_factory.mktemp("compare") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(STRICT_ENV, "1")  # the rank processes inherit it
        proc = subprocess.run(
            [sys.executable, "-m", "neoxlab", f"train.steps={COMPARE_STEPS}",
             "logger.wandb=disabled", f"launch.results_dir={results}"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return CompareRun(proc, results)


@pytest.fixture(scope="session")
def trained_3d(tmp_path_factory) -> Path:
    """local_3d (TP=2 x PP=2 x DP=2, ZeRO-1) trained TRAIN_STEPS steps with checkpoints: the
    training tests read its run dir and losses, the serving tests its checkpoints."""
    results = tmp_path_factory.mktemp("local_3d")
    proc, run_dir = run_experiment("local_3d", results, f"train.steps={TRAIN_STEPS}",
                                   f"train.checkpoint_every={CHECKPOINT_EVERY}", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_status(run_dir)["state"] == "completed"
    return run_dir
