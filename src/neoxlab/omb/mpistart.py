"""Start MPI at the thread level OSU runs at (single) unless the user asks for another.

mpi4py asks MPI for MPI_THREAD_MULTIPLE by default; OSU's MPI_Init gets MPI_THREAD_SINGLE.
On MPICH the level changes the numbers both ways (small calls cost more at multiple, large
all-reduces on 2 ranks ran faster there), so neoxlab.omb starts like OSU and says which
level MPI gave in its header. The level must be chosen before mpi4py.MPI is imported.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .options import DEFAULT_THREAD_LEVEL, THREAD_LEVELS

ENV = "MPI4PY_RC_THREAD_LEVEL"  # mpi4py reads it at import, over mpi4py.rc


def chosen_level(requested: str | None, environ: dict[str, str] | None = None) -> str:
    """--thread-level if valid, else $MPI4PY_RC_THREAD_LEVEL if valid, else single."""
    env = os.environ if environ is None else environ
    for level in (requested, env.get(ENV)):
        if level in THREAD_LEVELS:
            return level
    return DEFAULT_THREAD_LEVEL


def start_mpi(requested: str | None = None) -> Any:
    """Import mpi4py.MPI asking for the chosen thread level; returns the MPI module.

    When MPI was already imported (the Python API inside a program that started MPI) the
    level it has stays: MPI cannot change it after initialization.
    """
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        level = chosen_level(requested)
        mpi4py.rc.thread_level = level
        os.environ[ENV] = level  # the variable would win over rc
    from mpi4py import MPI

    return MPI
