"""SIGUSR1 / SIGTERM as "checkpoint now and exit": the scheduler's warning before walltime.

A signal may reach some ranks and not others (or at different moments), so a rank only
notes it; at each step boundary the ranks agree through one tiny MPI all-reduce, and all of
them save and stop at the same step. mpiexec (MPICH hydra) forwards both signals to every
rank. Cluster job scripts take the scheduler's warning in the batch shell instead and write
a stop-request file into the run dir (a signal to the job's processes would also kill any
child a rank runs at that moment, e.g. DeepSpeed's extension build); rank 0 looks for it
at each step boundary.
"""

from __future__ import annotations

import signal
from pathlib import Path

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def stop_request_file(run_dir: Path) -> Path:
    """Created by a cluster job script at the time-limit warning (or by hand); every launch
    removes it before its ranks start (neoxlab.launch.attempt)."""
    return run_dir / "stop.request"


class StopSignals:
    """Remembers the first stop signal this rank received; `agreed` makes it the job's."""

    def __init__(self, request_file: Path | None = None) -> None:
        self.received = 0
        self.request_file = request_file
        self._previous: dict[int, object] = {}

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._note)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _note(self, signum: int, frame) -> None:
        self.received = self.received or signum

    def agreed(self) -> int:
        """The signal any rank received so far (0: none); every rank gets the same answer."""
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        mine = self.received
        if not mine and self.request_file is not None and comm.Get_rank() == 0:
            mine = signal.SIGUSR1 if self.request_file.exists() else 0
        return int(comm.allreduce(mine, op=MPI.MAX))


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
