"""SIGUSR1 / SIGTERM as "checkpoint now and exit": the scheduler's warning before walltime.

A signal may reach some ranks and not others (or at different moments), so a rank only
notes it; at each step boundary the ranks agree through one tiny MPI all-reduce, and all of
them save and stop at the same step. mpiexec (MPICH hydra) forwards both signals to every
rank; LSF (bsub -wa) and Slurm (--signal) deliver them to the job's processes.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopSignals:
    """Remembers the first stop signal this rank received; `agreed` makes it the job's."""

    def __init__(self) -> None:
        self.received = 0
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
        from mpi4py import MPI

        return int(MPI.COMM_WORLD.allreduce(self.received, op=MPI.MAX))


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
