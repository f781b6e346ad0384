"""Name the rank that ended a job and why, from error files or the MPI launcher's output."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil


class RankWatch:
    """Notices which rank's process ends first: under MPI the first to die is the cause,
    and the errors the other ranks raise afterwards (broken connections) are consequences."""

    def __init__(self, run_dir: Path):
        self.logs = run_dir / "logs"
        self.pids: dict[int, psutil.Process] = {}
        self.first_dead: int | None = None
        self.first_dead_at: float | None = None

    def poll(self) -> None:
        for path in self.logs.glob("rank*.pid"):
            rank = int(path.stem.removeprefix("rank"))
            if rank not in self.pids:
                try:
                    self.pids[rank] = psutil.Process(int(path.read_text()))
                except (ValueError, psutil.NoSuchProcess):
                    continue
        if self.first_dead is not None:
            return
        for rank, proc in sorted(self.pids.items()):
            if not _alive(proc) and not (self.logs / f"rank{rank}.done").exists():
                self.first_dead, self.first_dead_at = rank, time.time()
                return


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


_EXIT_STRING = re.compile(r"EXIT STRING: (.+)")


def diagnose(
    run_dir: Path, launcher_output: str, exit_code: int, first_dead: int | None = None
) -> dict:
    """Fields for status.json: failed_rank and error, as precise as the evidence allows."""
    recorded = first_rank_error(run_dir)
    if first_dead is not None and (recorded is None or recorded["rank"] != first_dead):
        own = run_dir / "logs" / f"rank{first_dead}.error.json"
        if own.exists():
            return {"failed_rank": first_dead, "error": json.loads(own.read_text())["error"]}
        how = _EXIT_STRING.search(launcher_output)
        detail = how.group(1).strip() if how else f"launcher exit code {exit_code}"
        return {
            "failed_rank": first_dead,
            "error": f"rank {first_dead} died without recording an error ({detail})",
        }
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
