"""What a new attempt of a run must not inherit from the attempt before it.

Every launch path calls `clear_previous_attempt` before its ranks start: the local launcher
(`make run`, `make resume`) and a cluster job's `jobstep begin` (first job, requeue or
resubmission alike), so a relaunched run behaves the same wherever it runs.
"""

from __future__ import annotations

from pathlib import Path

from neoxlab.engines.builtin.preemption import stop_request_file

RANK_MARKERS = ("rank*.pid", "rank*.done", "rank*.error.json")


def clear_previous_attempt(run_dir: Path) -> None:
    """Remove the stop request (the previous attempt obeyed it already; left in place it
    would stop the resumed run again after one step) and the previous ranks' pid, done and
    error files (they would mislead the launcher's watch and the failure diagnosis)."""
    stop_request_file(run_dir).unlink(missing_ok=True)
    logs = run_dir / "logs"
    for pattern in RANK_MARKERS:
        for path in logs.glob(pattern):
            path.unlink(missing_ok=True)
