"""The frame every per-rank program runs in: logs, pid/done markers, status, failure.

A rank that fails records its error in logs/rank<N>.error.json and aborts the whole MPI job,
so no rank is left waiting in a collective; the launcher's watch reads the pid/done markers.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from neoxlab.config import Config
from neoxlab.files import now
from neoxlab.run import dist, rundir

RankBody = Callable[[Config, dist.RankInfo, "TextIO | None"], None]
PREEMPTED_EXIT = 85  # the job stopped on request after saving a checkpoint: requeue it


@dataclass(frozen=True)
class RankProgram:
    """What every rank of a job runs (`python -m <module> <run_dir>`, built on run_rank), and
    the modules a local fork server imports once for all ranks. The task record owns it;
    the commands hand it to the launcher, which knows no task."""

    module: str
    warm_imports: tuple[str, ...] = ()


class Preempted(Exception):  # noqa: N818 - an outcome, not an error
    """Raised by every rank's body together (they agreed on it) once a checkpoint is saved,
    to end the job now and have it started again; `fields` go into status.json."""

    def __init__(self, reason: str, **fields):
        super().__init__(reason)
        self.fields = fields


def redirect_output(run_dir: Path, rank: int) -> TextIO:
    """Send this rank's stdout/stderr to logs/rank<N>.log; return the old terminal stream."""
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    log = (run_dir / "logs" / f"rank{rank}.log").open("a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    return terminal


def record_failure(run_dir: Path, rank: int, exc: BaseException) -> None:
    error = {
        "rank": rank,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
        "time": now(),
    }
    rundir.write_json(run_dir / "logs" / f"rank{rank}.error.json", error)
    print(error["traceback"], file=sys.stderr, flush=True)


def run_rank(run_dir: Path, body: RankBody) -> int:
    """Discover this rank, run body(cfg, info, terminal-or-None), record the outcome."""
    cfg = rundir.load_config(run_dir)
    info = dist.discover(cfg.launch.master_port)
    terminal = redirect_output(run_dir, info.rank)
    logs = run_dir / "logs"
    for stale in (f"rank{info.rank}.done", f"rank{info.rank}.error.json"):  # earlier attempt's
        (logs / stale).unlink(missing_ok=True)
    rundir.write_atomic(logs / f"rank{info.rank}.pid", str(os.getpid()))
    try:
        if info.rank == 0:
            rundir.begin_attempt(run_dir)
            rundir.set_status(run_dir, rundir.State.RUNNING, world_size=info.world_size)
        body(cfg, info, terminal if info.rank == 0 else None)
    except Preempted as stop:
        rundir.write_atomic(logs / f"rank{info.rank}.done", "")
        if info.rank == 0:
            rundir.set_status(run_dir, rundir.State.PREEMPTED, exit_code=PREEMPTED_EXIT,
                              **stop.fields)
            rundir.end_attempt(run_dir, PREEMPTED_EXIT, f"preempted: {stop}")
        dist.barrier()  # no rank exits (and gets the others killed) before status is written
        return PREEMPTED_EXIT
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        error = f"{type(exc).__name__}: {exc}"
        try:
            record_failure(run_dir, info.rank, exc)
            rundir.set_status(run_dir, rundir.State.FAILED, failed_rank=info.rank, error=error)
            rundir.end_attempt(run_dir, 1, f"rank {info.rank}: {error}")
        except OSError as unrecorded:  # e.g. a full disk: the job must still end
            print(f"[neoxlab] rank {info.rank}: could not record its failure ({unrecorded}); "
                  f"the error was {error}", file=sys.stderr, flush=True)
        dist.abort_job(1)
    rundir.write_atomic(logs / f"rank{info.rank}.done", "")
    if info.rank == 0:
        rundir.set_status(run_dir, rundir.State.COMPLETED, exit_code=0)
        rundir.end_attempt(run_dir, 0, "completed")
    return 0
