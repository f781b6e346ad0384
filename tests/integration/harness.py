"""Helpers to run the harness as a user would (a subprocess), with a hard timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

# local_3d as TP=2 x PP=2 on 4 ranks: both model-parallel dimensions at half the start-up of
# its 8 ranks, for tests whose subject does not depend on the data-parallel degree
FOUR_RANKS = ("parallel.dp=1", "cluster.ranks_per_node=4")

# The session's shared runs (conftest): local_compare's members, trained TRAIN_STEPS steps
# with checkpoints after steps 5 and 10. The compression tests read none and mzhybrid and
# compare their own runs of the same length with them; local_baseline (local_3d's layout
# and scheme under another name) is also the training tests' 3D run and the serving tests'
# checkpoints.
COMPARE_MEMBERS = ("local_baseline", "local_naive", "local_zhybrid", "local_mzhybrid")
TRAIN_STEPS, CHECKPOINT_EVERY = 10, 5
COMPARE_STEPS = TRAIN_STEPS


def run_experiment(
    experiment: str, results_dir: Path, *overrides: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, Path]:
    cmd = [sys.executable, "-m", "neoxlab", f"experiment={experiment}",
           f"launch.results_dir={results_dir}", "logger.wandb=disabled", *overrides]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    root = results_dir / experiment
    run_dirs = sorted(root.iterdir()) if root.exists() else []
    assert run_dirs, f"no run dir created:\n{proc.stdout}\n{proc.stderr}"
    return proc, run_dirs[-1]


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def read_status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def processes_of(run_dir: Path) -> list:
    """Live processes whose command line names this run dir (ranks, proxies)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def resume_run(run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m neoxlab resume <run_dir>`, as `make resume RUN=<run_dir>` runs it."""
    cmd = [sys.executable, "-m", "neoxlab", "resume", str(run_dir)]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
