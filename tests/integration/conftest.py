"""Fixtures for integration tests: `requires_slurm` and `requires_emulated_slurm` skip (or, in
CI, fail) without the machine's Slurm or the emulated cluster's own,
and the runs several test modules share. Each 8-rank launch costs most of its time in
start-up on a small machine, so one run per distinct layout/scheme serves every module that
asserts on it (session scope: made once, by the first test that needs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from neoxlab.comm.strict import STRICT_ENV
from neoxlab.commands.cli import main
from neoxlab.launch import manifest
from tests.conftest import REPO_ROOT
from tests.integration.harness import (
    CHECKPOINT_EVERY,
    COMPARE_STEPS,
    FOUR_RANKS,
    processes_of,
    read_status,
    run_experiment,
)
from tests.integration.slurm import (
    cancel,
    emulated_slurm_problem,
    skip_or_fail,
    slurm_ready_cached,
)


def _slurm_or_skip() -> None:
    """Skip with the reason when no Slurm controller/node answers; fail when CI requires it."""
    skip_or_fail(slurm_ready_cached())


@pytest.fixture
def requires_slurm() -> None:
    _slurm_or_skip()


@pytest.fixture(scope="session")
def neox_dir() -> Path:
    """The GPT-NeoX checkout (tests/integration/neox_checkout.py: the vendored tarball
    unpacked once into build/gpt-neox); skips with the reason without one, and fails instead
    where CI sets NEOXLAB_REQUIRE_NEOX=1 (CI has ../shared/vendor: a skip there hides a break)."""
    from tests.integration.neox_checkout import checkout

    path, why = checkout()
    if path is None:
        if os.environ.get("NEOXLAB_REQUIRE_NEOX") == "1":
            pytest.fail(f"NEOXLAB_REQUIRE_NEOX=1 but {why}")
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def requires_emulated_slurm() -> None:
    """For runs on the emulated cluster with cluster.launcher=srun (its own multi-node Slurm):
    skip with the reason without slurm-wlm and munged; fail when CI requires it. Session
    scope: set up before any module-scoped run that needs it."""
    skip_or_fail(emulated_slurm_problem())


@dataclass(frozen=True)
class TimeLimitJob:
    """local_slurm on 2 ranks (TP=2: the requeue path is under test, not the layout, and
    fewer ranks take less CPU from the tests that run meanwhile) with a 5-minute limit and
    Slurm's USR1 90 s before it, which Slurm may send up to a minute early: from 150 s on,
    well after step `held` even on a machine busy with other tests. The job is held after
    step `held` of `steps` (launch.hold_step) until that signal; the first job checkpoints
    and stops there, `jobstep end` resubmits the script, and the second job trains the
    rest. Results under `results`."""

    results: Path
    steps: int = 30
    held: int = 20


TIME_LIMIT_STARTER = "test_time_limit_job_is_submitted_first"


@pytest.fixture(scope="session")
def time_limit_job(tmp_path_factory) -> Iterator[TimeLimitJob]:
    """Submitted by the session's first test (pytest_collection_modifyitems): the job spends
    most of its 3-4 minutes waiting for Slurm's signal, while the other tests run; the test
    that checks it comes later. Its jobs are cancelled when the session ends."""
    _slurm_or_skip()
    job = TimeLimitJob(tmp_path_factory.mktemp("time_limit") / "results")
    assert main(["experiment=local_slurm", "parallel.pp=1", "cluster.ranks_per_node=2",
                 f"train.steps={job.steps}", "cluster.walltime=5",
                 "launch.warn_before_s=90", "launch.requeue=6", f"launch.hold_step={job.held}",
                 f"launch.results_dir={job.results}"]) == 0
    yield job
    for submitted in manifest.read(job.results, "local_slurm"):
        cancel(submitted["job_id"])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The time-limit job's starter runs first, whatever the module order."""
    starters = [item for item in items if item.name == TIME_LIMIT_STARTER]
    items[:] = starters + [item for item in items if item.name != TIME_LIMIT_STARTER]


@dataclass(frozen=True)
class CompareRun:
    """The default experiment (local_compare, four schemes on the 8-rank 3D layout) as a user
    starts it: `python -m neoxlab` with no experiment, in strict-device mode, TRAIN_STEPS
    steps with checkpoints every CHECKPOINT_EVERY."""

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
             f"train.checkpoint_every={CHECKPOINT_EVERY}", "logger.wandb=disabled",
             f"launch.results_dir={results}"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return CompareRun(proc, results)


@pytest.fixture(scope="session")
def trained_3d(compare_run) -> Path:
    """local_3d's layout and scheme (TP=2 x PP=2 x DP=2, ZeRO-1, none) trained TRAIN_STEPS
    steps with checkpoints: compare_run's local_baseline member, which differs from
    local_3d only in its name. The training tests read its run dir and losses, the serving
    tests its checkpoints (read-only: a test that changes it works on a copy)."""
    run_dir = compare_run.member("local_baseline")
    assert read_status(run_dir)["state"] == "completed"
    return run_dir


@dataclass(frozen=True)
class FailedRun:
    """A 4-rank local_3d run whose rank 3 raises at step 5 after a checkpoint every step,
    as the launcher left it: the outcome recorded when it ended (status, the rank's error
    file, live processes, seconds from start to end, start-up included) and its run dir."""

    proc: subprocess.CompletedProcess
    run_dir: Path
    status: dict
    error_file_written: bool
    leftovers: list
    elapsed_s: float


@pytest.fixture(scope="session")
def failed_at_step_5(tmp_path_factory) -> FailedRun:
    """Shared by the failure test (reads the recorded outcome) and the damaged-checkpoint
    test (damages checkpoints 2-4 in place, then resumes): one launch instead of two."""
    start = time.monotonic()
    proc, run_dir = run_experiment(
        "local_3d", tmp_path_factory.mktemp("failed_at_step_5"), *FOUR_RANKS, "train.steps=5",
        "train.checkpoint_every=1", "train.keep_checkpoints=4", "launch.fail_rank=3",
        "launch.fail_step=5",
    )
    elapsed = time.monotonic() - start
    return FailedRun(proc, run_dir, read_status(run_dir),
                     (run_dir / "logs" / "rank3.error.json").exists(), processes_of(run_dir),
                     elapsed)
