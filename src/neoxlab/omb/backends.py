"""Communication backends: mpi4py and torch.distributed behind the same small surface.

Each method binds its buffers once and returns a zero-argument callable (a functools.partial
where possible, which runs in C), so the timed loop holds no argument parsing and no Python
frames beyond the call itself. Counts are always Python ints: MPI counts are integers, and
mpi4py >= 4 rejects the float counts that OMB-Py computes for its reductions.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .buffers import BufferKind
from .options import DType

Call = Callable[[], Any]


def _noop() -> None:
    return None


class MpiBackend:
    """mpi4py's buffer-protocol (upper-case) methods on any MPI library."""

    name = "mpi"
    in_place_reductions = False  # MPI has separate send and receive buffers

    def __init__(self, comm: Any, kind: BufferKind):
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        self.MPI, self.comm, self.kind = MPI, comm, kind
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def describe(self) -> str:
        # deferred: mpi4py initialises MPI on import
        import mpi4py

        lib = self.MPI.Get_library_version().splitlines()[0].strip()
        return f"mpi4py {mpi4py.__version__} ({' '.join(lib.split())})"

    def _arg(self, buf: Any, count: int, dt: DType, reduce: bool = False) -> list:
        return [self._fast(buf), int(count),
                getattr(self.MPI, dt.mpi_reduce if reduce else dt.mpi)]

    def _fast(self, buf: Any) -> Any:
        """mpi4py's own buffer object over host memory, else `buf` itself (device memory).

        mpi4py asks the exporter for the memory on every call; for a NumPy array that
        request is the largest Python cost of a small call. MPI.buffer asks once and answers
        later requests itself (measured: about 0.2-0.4 us less per call here). CPU torch
        tensors share their memory with .numpy().
        """
        wrap = getattr(self.MPI, "buffer", None) or self.MPI.memory
        if self.kind.device:
            return buf
        for candidate in (buf, getattr(buf, "numpy", None)):
            if candidate is None:
                continue
            try:
                return wrap(candidate() if candidate is not buf else candidate)
            except (TypeError, ValueError, BufferError):
                continue
        return buf

    # collectives (count = elements per rank block unless said otherwise)
    def allreduce(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        return partial(self.comm.Allreduce, self._arg(s, count, dt, True),
                       self._arg(r, count, dt, True), self.MPI.SUM)

    def reduce(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.comm.Reduce, self._arg(s, count, dt, True),
                       self._arg(r, count, dt, True), self.MPI.SUM, root)

    def reduce_scatter(self, s: Any, r: Any, counts: list[int], dt: DType) -> Call:
        return partial(self.comm.Reduce_scatter, self._arg(s, sum(counts), dt, True),
                       self._arg(r, counts[self.rank], dt, True), [int(c) for c in counts],
                       self.MPI.SUM)

    def allgather(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        # mpi4py reads the receive count as the per-rank block count
        return partial(self.comm.Allgather, self._arg(s, count, dt), self._arg(r, count, dt))

    def alltoall(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        return partial(self.comm.Alltoall, self._arg(s, count, dt), self._arg(r, count, dt))

    def gather(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.comm.Gather, self._arg(s, count, dt), self._arg(r, count, dt), root)

    def scatter(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.comm.Scatter, self._arg(s, count, dt), self._arg(r, count, dt), root)

    def bcast(self, buf: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.comm.Bcast, self._arg(buf, count, dt), root)

    def barrier(self) -> Call:
        return self.comm.Barrier

    # point to point
    def send(self, buf: Any, count: int, dt: DType, peer: int, tag: int) -> Call:
        return partial(self.comm.Send, self._arg(buf, count, dt), peer, tag)

    def recv(self, buf: Any, count: int, dt: DType, peer: int, tag: int) -> Call:
        return partial(self.comm.Recv, self._arg(buf, count, dt), peer, tag)

    def window(self, sends: list[tuple], recvs: list[tuple], dt: DType) -> tuple[Call, Call]:
        """Start all (buf, count, peer, tag) receives then sends, wait for all.

        Persistent requests keep 64 Isend/Irecv constructions out of every timed iteration.
        Returns (call, close).
        """
        comm = self.comm
        reqs = [comm.Recv_init(self._arg(b, c, dt), p, t) for b, c, p, t in recvs]
        reqs += [comm.Send_init(self._arg(b, c, dt), p, t) for b, c, p, t in sends]
        start, wait = self.MPI.Prequest.Startall, self.MPI.Request.Waitall

        def call() -> None:
            start(reqs)
            wait(reqs)

        def close() -> None:
            for req in reqs:
                req.Free()

        return call, close

    # byte transport for compressed collectives (torch uint8 tensors)
    def allgatherv_bytes(self, enc: Any, out: Any, pad: Any) -> list:
        """Gather variable-size byte buffers exactly (sizes first, then Allgatherv)."""
        sizes = self._ints([int(enc.numel())], self.comm.Allgather)
        displs = [sum(sizes[:j]) for j in range(self.size)]
        self.comm.Allgatherv([enc, len(enc), self.MPI.BYTE],
                             [out, (sizes, displs), self.MPI.BYTE])
        return [out[d:d + s] for d, s in zip(displs, sizes, strict=True)]

    def alltoallv_bytes(self, chunks: list, send: Any, out: Any) -> list:
        sizes = [int(c.numel()) for c in chunks]
        rsizes = self._ints(sizes, self.comm.Alltoall)
        sd = [sum(sizes[:j]) for j in range(self.size)]
        rd = [sum(rsizes[:j]) for j in range(self.size)]
        for c, d in zip(chunks, sd, strict=True):
            send[d:d + c.numel()].copy_(c)
        self.comm.Alltoallv([send, (sizes, sd), self.MPI.BYTE], [out, (rsizes, rd), self.MPI.BYTE])
        return [out[d:d + s] for d, s in zip(rd, rsizes, strict=True)]

    def _ints(self, values: list[int], collective: Callable) -> list[int]:
        """Allgather (one value) or Alltoall (one per rank) of int64s, one per peer back."""
        send = np.array(values, dtype=np.int64)
        recv = np.empty(self.size, dtype=np.int64)
        collective([send, 1, self.MPI.INT64_T], [recv, 1, self.MPI.INT64_T])
        return [int(v) for v in recv]

    def bcast_bytes(self, enc: Any, out: Any, root: int) -> Any:
        size = np.array([enc.numel() if self.rank == root else 0], dtype=np.int64)
        self.comm.Bcast([size, 1, self.MPI.INT64_T], root)
        n = int(size[0])
        buf = enc if self.rank == root else out[:n]
        self.comm.Bcast([buf, n, self.MPI.BYTE], root)
        return buf

    def send_bytes(self, enc: Any, peer: int) -> None:
        self.comm.Send([enc, len(enc), self.MPI.BYTE], peer, 7)

    def recv_bytes(self, out: Any, peer: int) -> Any:
        status = self.MPI.Status()
        self.comm.Probe(peer, 7, status)
        n = status.Get_count(self.MPI.BYTE)
        self.comm.Recv([out, n, self.MPI.BYTE], peer, 7)
        return out[:n]

    def shutdown(self) -> None:
        """Nothing to release: MPI outlives the benchmark."""


class TorchBackend:
    """torch.distributed (gloo on CPU, NCCL for CUDA tensors), initialized from MPI discovery."""

    name = "torch"
    in_place_reductions = True  # all_reduce/reduce work in place on one tensor

    def __init__(self, comm: Any, kind: BufferKind):
        # deferred: torch, only for torch buffers or --compress
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.kind = torch, dist, kind
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.created = init_torch_distributed(comm, "nccl" if kind.device else "gloo")
        # torch 2.13 renamed the *_into_tensor/_tensor variants to *_single
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def describe(self) -> str:
        return f"torch.distributed {self.dist.get_backend()} (torch {self.torch.__version__})"

    def allreduce(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        return partial(self.dist.all_reduce, r)

    def reduce(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.dist.reduce, r, root)

    def reduce_scatter(self, s: Any, r: Any, counts: list[int], dt: DType) -> Call:
        return partial(self._rs, r, s)

    def allgather(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        return partial(self._ag, r, s)

    def alltoall(self, s: Any, r: Any, count: int, dt: DType) -> Call:
        return partial(self.dist.all_to_all_single, r, s)

    def gather(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        blocks = list(r.split(count)) if self.rank == root else None
        return partial(self.dist.gather, s, blocks, root)

    def scatter(self, s: Any, r: Any, count: int, dt: DType, root: int) -> Call:
        blocks = list(s.split(count)) if self.rank == root else None
        return partial(self.dist.scatter, r, blocks, root)

    def bcast(self, buf: Any, count: int, dt: DType, root: int) -> Call:
        return partial(self.dist.broadcast, buf, root)

    def barrier(self) -> Call:
        return self.dist.barrier

    def send(self, buf: Any, count: int, dt: DType, peer: int, tag: int) -> Call:
        return partial(self.dist.send, buf, peer)

    def recv(self, buf: Any, count: int, dt: DType, peer: int, tag: int) -> Call:
        return partial(self.dist.recv, buf, peer)

    def window(self, sends: list[tuple], recvs: list[tuple], dt: DType) -> tuple[Call, Call]:
        isend, irecv = self.dist.isend, self.dist.irecv

        def call() -> None:
            works = [irecv(b, p, tag=t) for b, _, p, t in recvs]
            works += [isend(b, p, tag=t) for b, _, p, t in sends]
            for w in works:
                w.wait()

        return call, _noop

    def _int_tensor(self, values: list[int]) -> Any:
        return self.torch.tensor(values, dtype=self.torch.int64, device=self.kind.dev)

    def allgatherv_bytes(self, enc: Any, out: Any, pad: Any) -> list:
        sizes = self.torch.empty(self.size, dtype=self.torch.int64, device=self.kind.dev)
        self._ag(sizes, self._int_tensor([enc.numel()]))
        sizes_l = sizes.tolist()
        m = max(sizes_l)
        pad[:enc.numel()].copy_(enc)
        self._ag(out[:m * self.size], pad[:m])
        return [out[j * m:j * m + s] for j, s in enumerate(sizes_l)]

    def alltoallv_bytes(self, chunks: list, send: Any, out: Any) -> list:
        sizes = [int(c.numel()) for c in chunks]
        rs = self.torch.empty(self.size, dtype=self.torch.int64, device=self.kind.dev)
        self.dist.all_to_all_single(rs, self._int_tensor(sizes))
        rsizes = rs.tolist()
        torch_cat = self.torch.cat(chunks)
        send[:torch_cat.numel()].copy_(torch_cat)
        recv = out[:sum(rsizes)]
        self.dist.all_to_all_single(recv, send[:sum(sizes)], rsizes, sizes)
        return list(recv.split(rsizes))

    def bcast_bytes(self, enc: Any, out: Any, root: int) -> Any:
        n = self._int_tensor([enc.numel() if self.rank == root else 0])
        self.dist.broadcast(n, root)
        buf = enc if self.rank == root else out[:int(n.item())]
        self.dist.broadcast(buf, root)
        return buf

    def send_bytes(self, enc: Any, peer: int) -> None:
        self.dist.send(self._int_tensor([enc.numel()]), peer)
        self.dist.send(enc, peer)

    def recv_bytes(self, out: Any, peer: int) -> Any:
        n = self._int_tensor([0])
        self.dist.recv(n, peer)
        buf = out[:int(n.item())]
        self.dist.recv(buf, peer)
        return buf

    def shutdown(self) -> None:
        if self.created and self.dist.is_initialized():
            self.dist.destroy_process_group()


def rendezvous(comm: Any) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) agreed through MPI: rank 0's address, loopback when every
    rank shares one node and one network namespace. The node test is MPI's shared-memory
    split, not host names: on an emulated cluster (cluster=emulated) every rank has this
    machine's name, which resolves to its own namespace's address, and the ranks of one
    emulated node share memory but each has a namespace (and a loopback) of its own."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    one_node = comm.allreduce(local.Get_size(), op=MPI.MIN) == comm.Get_size()
    local.Free()
    namespaces = set(comm.allgather(network_namespace()))
    one_node = one_node and len(namespaces) == 1
    if comm.Get_rank() == 0:
        addr = "127.0.0.1" if one_node else socket.gethostbyname(socket.gethostname())
        port = int(os.environ.get("MASTER_PORT") or 0) or _free_port()
    else:
        addr, port = "", 0
    return comm.bcast((addr, port), root=0)


def network_namespace() -> int | None:
    """This process's network namespace (its inode; None off Linux): ranks in different ones
    cannot meet on loopback."""
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def init_torch_distributed(comm: Any, backend: str) -> bool:
    """Join (or reuse) the default process group; True when this call created it."""
    # deferred: torch, only for torch buffers or --compress
    import torch.distributed as dist

    rank, size = comm.Get_rank(), comm.Get_size()
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, size):
            raise RuntimeError(
                f"torch.distributed is already initialized as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but the MPI communicator is rank {rank} of {size}; "
                "benchmark on the communicator torch.distributed was set up with")
        return False
    addr, port = rendezvous(comm)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}",
                            rank=rank, world_size=size)
    return True


def make_backend(name: str, comm: Any, kind: BufferKind) -> MpiBackend | TorchBackend:
    return TorchBackend(comm, kind) if name == "torch" else MpiBackend(comm, kind)
