"""Start MPI at the thread level OSU runs at (single) unless the user asks for another, or
unless this machine's ranks outnumber its cores.

mpi4py asks MPI for MPI_THREAD_MULTIPLE by default; OSU's MPI_Init gets MPI_THREAD_SINGLE.
On MPICH the level changes the numbers both ways (small calls cost more at multiple, large
all-reduces on 2 ranks ran faster there), so neoxlab.omb starts like OSU and says which
level MPI gave in its header. The level must be chosen before mpi4py.MPI is imported.

More ranks than cores (4 ranks on a 2-core laptop): at single, MPICH busy-polls while it
waits, so a rank spins away the time slice the rank it waits for needs. Medians per call of
a 4-rank all-reduce of 4-64 B on a 2-core VM shared with other jobs (load 9-36), 4 runs
each: single 12-22 ms; multiple 0.65-7 ms (its wait loop gives up its lock and yields);
single with MPIR_CVAR_CH4_PROGRESS_THROTTLE (usleep after each idle poll) 0.01-3 ms, some
runs far slower; multiple with MPIR_CVAR_ENABLE_HEAVY_YIELD=1 (the yield is a nanosleep,
which hands the core over even when the scheduler would run the spinner again) 0.7-1.1 ms,
the steadiest. So an oversubscribed run starts in that last mode and its header says so
(start_mode); the numbers are then not OSU's, and the header says that too.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .options import DEFAULT_THREAD_LEVEL, THREAD_LEVELS

ENV = "MPI4PY_RC_THREAD_LEVEL"  # mpi4py reads it at import, over mpi4py.rc
# how many ranks share this machine, as each launcher tells its ranks before MPI starts:
# MPICH's hydra (the local launcher), Open MPI's mpirun
LOCAL_RANKS_ENV = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
OVERSUBSCRIBED_LEVEL = "multiple"
YIELD_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}  # MPICH: yield by nanosleep at multiple


@dataclass(frozen=True)
class StartMode:
    """How MPI is started: the thread level asked for, the MPI settings exported for it, and
    the ranks and cores that decided it (ranks None: the launcher did not say)."""

    level: str
    ranks: int | None
    cores: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def oversubscribed(self) -> bool:
        return self.ranks is not None and self.ranks > self.cores

    def note(self) -> str | None:
        """The header line for an oversubscribed run; None where OSU's mode applies."""
        if not self.oversubscribed:
            return None
        how = (f"MPI yields its core while it waits (thread level {self.level}"
               + "".join(f", {k}={v}" for k, v in sorted(self.env.items())) + ")"
               if self.level == OVERSUBSCRIBED_LEVEL else
               f"thread level {self.level} as asked: MPI busy-polls, calls wait on time slices")
        return (f"# Oversubscribed: {self.ranks} ranks on {self.cores} cores, so {how}; "
                "not OSU's numbers (run ranks <= cores for those).")

    def record(self) -> dict[str, Any]:
        return {"oversubscribed": self.oversubscribed, "local_ranks": self.ranks,
                "cores": self.cores, "thread_level": self.level, "env": dict(self.env)}


_started: StartMode | None = None  # set by start_mpi, read by the report's header


def chosen_level(requested: str | None, environ: dict[str, str] | None = None) -> str:
    """--thread-level if valid, else $MPI4PY_RC_THREAD_LEVEL if valid, else single."""
    env = os.environ if environ is None else environ
    for level in (requested, env.get(ENV)):
        if level in THREAD_LEVELS:
            return level
    return DEFAULT_THREAD_LEVEL


def local_ranks(environ: dict[str, str]) -> int | None:
    for name in LOCAL_RANKS_ENV:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def machine_cores() -> int:
    """Cores this process may run on (a cpuset or affinity mask, not the host's count).
    Ranks a launcher binds to one core each would count 1 here; neither hydra by default
    nor the local launcher binds."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def start_mode(requested: str | None, environ: dict[str, str], cores: int) -> StartMode:
    """OSU's level (single) unless asked otherwise; with more local ranks than cores, and no
    level asked for, multiple with MPICH's yielding wait. Settings already in the
    environment win over ours."""
    ranks = local_ranks(environ)
    level = chosen_level(requested, environ)
    if ranks is None or ranks <= cores:
        return StartMode(level, ranks, cores)
    asked = requested in THREAD_LEVELS or environ.get(ENV) in THREAD_LEVELS
    if not asked:
        level = OVERSUBSCRIBED_LEVEL
    env = {k: environ.get(k, v) for k, v in YIELD_ENV.items()} \
        if level == OVERSUBSCRIBED_LEVEL else {}
    return StartMode(level, ranks, cores, env)


def started_mode() -> StartMode | None:
    """The mode start_mpi chose in this process; None when MPI was started elsewhere."""
    return _started


def start_mpi(requested: str | None = None) -> Any:
    """Import mpi4py.MPI asking for the chosen thread level; returns the MPI module.

    When MPI was already imported (the Python API inside a program that started MPI) the
    level it has stays: MPI cannot change it after initialization.
    """
    global _started
    if "mpi4py.MPI" not in sys.modules:
        # deferred: mpi4py initialises MPI on import
        import mpi4py

        mode = start_mode(requested, dict(os.environ), machine_cores())
        mpi4py.rc.thread_level = mode.level
        os.environ[ENV] = mode.level  # the variable would win over rc
        os.environ.update(mode.env)  # MPICH reads its settings when MPI starts
        _started = mode
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    return MPI
