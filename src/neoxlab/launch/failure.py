"""Name the rank that ended a job and why, from error files or the MPI launcher's output."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import psutil

# Launcher output after which the ranks can never get past MPI_Init: the job fails at once
# with the cause, instead of hanging until launch.timeout_s (an hour by default).
FATAL_STARTUP = {
    "mpi/pmi2: invalid client request": (
        "Slurm's pmi2 plugin could not parse an MPI start-up message (Slurm 22.05 misreads "
        "MPICH's long PMI-1 lines now and then), so the ranks would wait in MPI_Init until "
        "launch.timeout_s; start the run again, or use cluster.launcher=mpiexec"),
}
STARTUP_FAILED = "start-up failed"


def fatal_startup(output: str) -> str | None:
    """The reason the job cannot start, when the launcher's output shows one."""
    for mark, why in FATAL_STARTUP.items():
        if mark in output:
            return f"{STARTUP_FAILED}: {why}"
    return None


class RankWatch:
    """Notices which rank's process ends first: under MPI the first to die is the cause,
    and the errors the other ranks raise afterwards (broken connections) are consequences."""

    def __init__(self, run_dir: Path, world_size: int):
        self.logs = run_dir / "logs"
        self.world_size = world_size
        self.pids: dict[int, psutil.Process] = {}
        self.first_dead: list[int] = []  # ranks found dead at the first poll that saw any

    def poll(self) -> None:
        pid_files = self.logs.glob("rank*.pid") if len(self.pids) < self.world_size else []
        for path in pid_files:
            rank = int(path.stem.removeprefix("rank"))
            if rank not in self.pids:
                try:
                    self.pids[rank] = psutil.Process(int(path.read_text()))
                except (ValueError, psutil.NoSuchProcess):
                    continue
        if self.first_dead:
            return
        self.first_dead = [
            rank for rank, proc in sorted(self.pids.items())
            if not _alive(proc) and not (self.logs / f"rank{rank}.done").exists()
        ]

    def reap(self, timeout: float = 10.0) -> None:
        """Return once every rank process has exited (zombies count as exited), killing the
        ones still there after `timeout`: a rank still running its error handler after
        mpiexec is gone would write status.json after the launcher's final word."""
        self.poll()
        deadline = time.monotonic() + timeout
        while alive := [proc for proc in self.pids.values() if _alive(proc)]:
            if time.monotonic() > deadline:
                for proc in alive:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        proc.kill()
                return
            time.sleep(0.05)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# MPICH hydra reports a dead process as "RANK <n> PID <pid> ..." then "KILLED BY SIGNAL: <s>".
_HYDRA_DEAD = re.compile(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*\n=\s+KILLED BY SIGNAL: (\d+)")
_HYDRA_EXIT = re.compile(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*\n=\s+EXIT STATUS: (\d+)")


# Errors a rank raises because a peer vanished: consequences, never the cause.
_PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Read error|Socket Timeout|Broken pipe")


def rank_errors(run_dir: Path) -> list[dict]:
    """Errors the ranks recorded themselves, earliest first."""
    errors = []
    for path in sorted((run_dir / "logs").glob("rank*.error.json")):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(errors, key=lambda e: e.get("time", ""))


_EXIT_STRING = re.compile(r"EXIT STRING: (.+)")


def diagnose(
    run_dir: Path, launcher_output: str, exit_code: int, first_dead: list[int] | None = None
) -> dict:
    """Fields for status.json: failed_rank and error, as precise as the evidence allows.

    A rank's own error wins unless it is only a lost connection; then a rank that died
    without recording anything (killed, crashed) is the cause."""
    errors = rank_errors(run_dir)
    causes = [e for e in errors if not _PEER_LOST.search(e["error"])]
    if causes:
        return {"failed_rank": causes[0]["rank"], "error": causes[0]["error"]}
    recorded = {e["rank"] for e in errors}
    silent = [r for r in first_dead or [] if r not in recorded]
    if silent:
        how = _EXIT_STRING.search(launcher_output)
        detail = how.group(1).strip() if how else f"launcher exit code {exit_code}"
        return {
            "failed_rank": silent[0],
            "error": f"rank {silent[0]} died without recording an error ({detail})",
        }
    if errors:
        return {"failed_rank": errors[0]["rank"], "error": errors[0]["error"]}
    killed = _HYDRA_DEAD.search(launcher_output)
    if killed:
        rank, sig = int(killed.group(1)), int(killed.group(2))
        return {"failed_rank": rank, "error": f"rank {rank} was killed by signal {sig}"}
    exited = _HYDRA_EXIT.search(launcher_output)
    if exited:
        rank = int(exited.group(1))
        return {"failed_rank": rank, "error": f"rank {rank} exited with status {exited.group(2)}"}
    return {"failed_rank": None, "error": f"launcher exited with code {exit_code}"}
