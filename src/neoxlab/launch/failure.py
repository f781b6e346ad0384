"""Name the rank that ended a job and why, from error files or the MPI launcher's output."""

from __future__ import annotations

import json
import re
from pathlib import Path

# MPICH hydra reports a dead process as "RANK <n> PID <pid> ..." then "KILLED BY SIGNAL: <s>".
_HYDRA_DEAD = re.compile(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*\n=\s+KILLED BY SIGNAL: (\d+)")
_HYDRA_EXIT = re.compile(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*\n=\s+EXIT STATUS: (\d+)")


def first_rank_error(run_dir: Path) -> dict | None:
    """The earliest error a rank recorded itself (later ones are usually consequences)."""
    errors = []
    for path in sorted((run_dir / "logs").glob("rank*.error.json")):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return min(errors, key=lambda e: e.get("time", "")) if errors else None


def diagnose(run_dir: Path, launcher_output: str, exit_code: int) -> dict:
    """Fields for status.json: failed_rank and error, as precise as the evidence allows."""
    recorded = first_rank_error(run_dir)
    if recorded is not None:
        return {"failed_rank": recorded["rank"], "error": recorded["error"]}
    killed = _HYDRA_DEAD.search(launcher_output)
    if killed:
        rank, sig = int(killed.group(1)), int(killed.group(2))
        return {"failed_rank": rank, "error": f"rank {rank} was killed by signal {sig}"}
    exited = _HYDRA_EXIT.search(launcher_output)
    if exited:
        rank = int(exited.group(1))
        return {"failed_rank": rank, "error": f"rank {rank} exited with status {exited.group(2)}"}
    return {"failed_rank": None, "error": f"launcher exited with code {exit_code}"}
