"""Rank discovery through MPI, the one path that works under mpiexec, jsrun and srun.

Neither DeepSpeed's nor GPT-NeoX's launcher supports jsrun, so every rank finds its rank,
local rank and rendezvous address from MPI itself and exports the torch.distributed variables.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def discover(master_port: int | None = None) -> RankInfo:
    """Read rank facts from MPI and export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* for torch."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank = local.Get_rank()
    single_host = comm.allreduce(local.Get_size(), op=MPI.MIN) == size
    local.Free()
    if rank == 0:
        addr = "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())
        port = master_port or int(os.environ.get("MASTER_PORT", 0)) or free_port()
    else:
        addr, port = "", 0
    addr, port = comm.bcast((addr, port), root=0)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local_rank),
        MASTER_ADDR=addr, MASTER_PORT=str(port),
    )
    return RankInfo(rank, size, local_rank, addr, port)


def free_port() -> int:
    """A port free right now on this host; the rendezvous binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def barrier() -> None:
    """Every rank of the job reaches this point (control plane, outside torch.distributed)."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (a failing rank must not leave others hanging)."""
    try:
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)
