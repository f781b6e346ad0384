"""A torch.distributed process group over mpi4py, registered as the backend "mpi4py".

Stock torch wheels are built without torch's own MPI backend; this one lets any group (for
example only the DP groups) run on the MPI library that started the ranks, with that
library's own tuning and, where it has it, its on-the-fly compression (MVAPICH-Plus).

Every collective runs to completion inside the call on the calling thread (MPI's blocking
calls on a communicator made for the group's ranks) and returns a finished Work, so an
`async_op=True` caller gets the same ordering as with a synchronous gloo call. Tensors are
handed to MPI through the buffer protocol (host memory, no copy when contiguous). CUDA
tensors go to MPI as device pointers only when the library says it is CUDA-aware
(MPIX_Query_cuda_support, asked of the library mpi4py loaded); otherwise they are staged
through host memory (`staged`), and a GPU rank says so once at start-up.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

BACKEND = "mpi4py"  # "mpi" is torch's own (absent from CPU wheels): a name of our own
_HALF = (torch.float16, torch.bfloat16)
CALLS: Counter[str] = Counter()  # collectives run by this process's MPI groups, by op


def summary() -> str:
    """'allreduce 12, barrier 3, ...' for the rank's log."""
    return ", ".join(f"{op} {n}" for op, n in sorted(CALLS.items()))


@dataclass(frozen=True)
class CudaSupport:
    """What the MPI library mpi4py loaded says about device pointers."""

    aware: bool
    library: str  # the first line of MPI_Get_library_version
    source: str | None  # the loaded file that answered MPIX_Query_cuda_support (None: none)

    def describe(self) -> str:
        if self.aware:
            return f"{self.library} is CUDA-aware ({self.source}): device pointers go to MPI"
        why = (f"its MPIX_Query_cuda_support ({self.source}) says no" if self.source else
               "it exports no MPIX_Query_cuda_support")
        return (f"{self.library} is not CUDA-aware ({why}): CUDA tensors are staged through "
                "host memory; load the site's CUDA-aware MPI (Lassen: Spectrum MPI with "
                "jsrun --smpiargs=-gpu, or MVAPICH2-GDR with MV2_USE_CUDA=1)")


def cuda_support() -> CudaSupport:
    """Ask the MPI library mpi4py loaded whether it accepts device pointers (MPICH, MVAPICH
    and Open MPI export MPIX_Query_cuda_support; a library without it is taken as
    host-only). mpi4py loads libmpi privately (RTLD_LOCAL), so the symbol is looked up
    through mpi4py's own extension (its dependencies included), then in every loaded libmpi
    file, not in the global namespace alone."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0].strip()
    for path in _loaded_mpi_files(getattr(MPI, "__file__", None)):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            query = lib.MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return CudaSupport(bool(query()), library, path or "the global namespace")
    return CudaSupport(False, library, None)


def cuda_aware() -> bool:
    """Whether the MPI library accepts device pointers (see cuda_support)."""
    return cuda_support().aware


def _loaded_mpi_files(extension: str | None) -> list[str | None]:
    """Where MPIX_Query_cuda_support may live, most specific first: mpi4py's extension
    module (a handle's lookup covers the libraries it links), each libmpi* this process has
    mapped (mpi4py may dlopen it itself), and the global namespace (None)."""
    found: list[str | None] = [extension] if extension else []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:  # address perms offset device inode [path]
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                name = os.path.basename(path)
                if name.startswith(("libmpi", "libmpich")) and ".so" in name \
                        and path not in found:
                    found.append(path)
    except OSError:
        pass  # no /proc: the extension and the global namespace remain
    return [*found, None]


_ANNOUNCED: list[CudaSupport] = []


def announce(support: CudaSupport) -> None:
    """One start-up line per process on a GPU rank: whether CUDA tensors reach MPI as
    device pointers or are staged through host memory."""
    if _ANNOUNCED or not torch.cuda.is_available():
        return
    _ANNOUNCED.append(support)
    print(f"[neoxlab] {BACKEND} process groups: {support.describe()}", flush=True)


def library_version() -> str:
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    return MPI.Get_library_version().strip()


def _mpi_op(op, MPI):
    """torch ReduceOp -> (MPI op, average afterwards)."""
    R = dist.ReduceOp
    table = {R.SUM: MPI.SUM, R.PRODUCT: MPI.PROD, R.MIN: MPI.MIN, R.MAX: MPI.MAX,
             R.BAND: MPI.BAND, R.BOR: MPI.BOR, R.BXOR: MPI.BXOR, R.AVG: MPI.SUM}
    for key, value in table.items():
        if op == key:
            return value, op == R.AVG
    raise ValueError(f"reduce op {op} is not supported by the {BACKEND} process group")


def _counted(method):
    """Count a collective by its torch-facing name."""
    name = method.__name__

    def run(self, *args, **kwargs):
        CALLS[name] += 1
        return method(self, *args, **kwargs)

    run.__name__ = name
    run.__doc__ = method.__doc__
    return run


def _finished(result) -> dist.Work:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class MpiProcessGroup(dist.ProcessGroup):
    """One torch process group = one MPI communicator over the same ranks in the same order
    (group rank i is communicator rank i)."""

    def __init__(self, comm, device_pointers: bool | None = None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        if device_pointers is None:
            support = cuda_support()
            announce(support)
            device_pointers = support.aware
        self.device_pointers = device_pointers
        self.staged = 0  # CUDA tensors that went through host memory (not CUDA-aware)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def __repr__(self) -> str:
        return f"MpiProcessGroup(rank={self.rank()}, size={self.size()})"

    # ---- buffers ----------------------------------------------------------------------
    @contextmanager
    def _buffer(self, tensor: torch.Tensor, reduce: bool = False, write: bool = True):
        """An object MPI can read (and write back) for `tensor`: its host memory, a CUDA
        device pointer when the library is CUDA-aware, else a host copy. fp16/bf16 that
        MPI must reduce travel as fp32 (MPI has no standard half type), converted where
        the tensor is; the sum of two halves is exact in fp32, so two-rank sums equal
        gloo's bit for bit. Autograd has no part in it (megatron all-reduces inside its
        autograd Functions): MPI sees the detached memory."""
        work = tensor.detach()
        copied = False
        on_device = work.device.type == "cuda"
        if on_device and not self.device_pointers:
            work = work.cpu()
            self.staged += 1
            copied = True
        if reduce and work.dtype in _HALF:
            work = work.float()
            copied = True
        elif not work.is_contiguous():
            work = work.contiguous()
            copied = True
        if on_device and self.device_pointers:
            # MPI knows no streams: all queued work, the copies above included, must be done
            torch.cuda.current_stream(work.device).synchronize()
        yield _mpi_view(work)
        if write and copied:
            with torch.no_grad():
                tensor.copy_(work)

    # ---- collectives ----------------------------------------------------------------
    @_counted
    def allreduce(self, tensors: Sequence[torch.Tensor], opts=None):
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        op, average = _mpi_op(_reduce_op(opts), MPI)
        for tensor in tensors:
            with self._buffer(tensor, reduce=True) as buf:
                self.comm.Allreduce(MPI.IN_PLACE, buf, op=op)
            if average:
                tensor.div_(self.size())
        return _finished(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    @_counted
    def reduce(self, tensors: Sequence[torch.Tensor], opts=None):
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        op, average = _mpi_op(_reduce_op(opts), MPI)
        root = opts.rootRank
        for tensor in tensors:
            mine = self.rank() == root
            with self._buffer(tensor, reduce=True, write=mine) as buf:
                self.comm.Reduce(MPI.IN_PLACE if mine else buf, buf if mine else None,
                                 op=op, root=root)
            if average and mine:
                tensor.div_(self.size())
        return _finished(list(tensors))

    @_counted
    def broadcast(self, tensors: Sequence[torch.Tensor], opts=None):
        root = opts.rootRank if opts is not None else 0
        for tensor in tensors:
            with self._buffer(tensor, write=self.rank() != root) as buf:
                self.comm.Bcast(buf, root=root)
        return _finished(list(tensors))

    @_counted
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        if _overlaps(input, output):  # ZeRO gathers from a slot of its own output buffer;
            input = input.clone()  # MPI forbids aliased send and receive buffers
        with self._buffer(input, write=False) as src, self._buffer(output) as dst:
            self.comm.Allgather(src, dst)
        return _finished([output])

    _allgather_base = all_gather_single  # torch < 2.12 names

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs, strict=True):
            self.all_gather_single(output, input, opts)
        return _finished(list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_counted
    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs, strict=True):
            flat = torch.empty((len(outputs), input.numel()), dtype=input.dtype,
                               device=input.device)
            self.all_gather_single(flat, input.contiguous())
            for out, row in zip(outputs, flat, strict=True):
                out.copy_(row.view_as(out))
        return _finished(output_lists)

    @_counted
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        op, average = _mpi_op(_reduce_op(opts), MPI)
        with self._buffer(input, reduce=True, write=False) as src, \
                self._buffer(output, reduce=True) as dst:
            self.comm.Reduce_scatter_block(src, dst, op=op)
        if average:
            output.div_(self.size())
        return _finished([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, input, opts)
        return _finished(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_counted
    def reduce_scatter(self, outputs, input_lists, opts=None):
        for output, inputs in zip(outputs, input_lists, strict=True):
            self.reduce_scatter_single(output, torch.cat([t.reshape(-1) for t in inputs]), opts)
        return _finished(list(outputs))

    @_counted
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int], input_split_sizes: list[int], opts=None):
        n = self.size()
        row_in = input.numel() // max(1, input.shape[0]) if input.dim() else 1
        row_out = output.numel() // max(1, output.shape[0]) if output.dim() else 1
        with self._buffer(input, write=False) as src, self._buffer(output) as dst:
            if not output_split_sizes and not input_split_sizes:
                self.comm.Alltoall(src, dst)
            else:
                send = _counts(input_split_sizes, input, n, row_in)
                recv = _counts(output_split_sizes, output, n, row_out)
                self.comm.Alltoallv([src, (send, _displs(send))], [dst, (recv, _displs(recv))])
        return _finished([output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        send = torch.cat([t.reshape(-1) for t in inputs])
        recv = torch.empty(sum(t.numel() for t in outputs), dtype=send.dtype,
                           device=send.device)
        self.all_to_all_single(recv, send, [t.numel() for t in outputs],
                               [t.numel() for t in inputs], opts)
        for out, part in zip(outputs, recv.split([t.numel() for t in outputs]), strict=True):
            out.copy_(part.view_as(out))
        return _finished(list(outputs))

    @_counted
    def barrier(self, opts=None):
        self.comm.Barrier()
        return _finished([])

    @_counted
    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0):
        for tensor in tensors:
            with self._buffer(tensor, write=False) as buf:
                self.comm.Send(buf, dest=dst, tag=tag)
        return _finished(list(tensors))

    @_counted
    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0):
        for tensor in tensors:
            with self._buffer(tensor) as buf:
                self.comm.Recv(buf, source=src, tag=tag)
        return _finished(list(tensors))

    def shutdown(self) -> None:
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()
            self.comm = MPI.COMM_NULL

    def abort(self) -> None:
        self.shutdown()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share memory (MPI refuses aliased buffers)."""
    if a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + a.numel() * a.element_size()
    b1 = b0 + b.numel() * b.element_size()
    return a0 < b1 and b0 < a1


def _reduce_op(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _counts(splits: list[int], tensor: torch.Tensor, n: int, row: int) -> list[int]:
    """All-to-all element counts per peer (equal when torch passes no splits)."""
    if not splits:
        return [tensor.numel() // n] * n
    return [s * row for s in splits]


def _displs(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _mpi_view(tensor: torch.Tensor):
    """A buffer-protocol object over the tensor's memory that MPI can type: numpy for host
    dtypes numpy knows, the CUDA array interface for device tensors (which a tensor that
    requires grad refuses, hence detached). fp16 and bf16 go as their raw 16-bit integers:
    here they are only moved, never reduced (reductions travel as fp32, see _buffer), and
    Spectrum MPI / Open MPI 4 and MVAPICH2 2.3 have no half type that mpi4py could map."""
    tensor = tensor.detach()
    if tensor.dtype in _HALF:
        tensor = tensor.view(torch.int16)
    return tensor if tensor.device.type == "cuda" else tensor.numpy()


def create(options, backend_options=None) -> MpiProcessGroup:
    """torch's creator hook (extended API): a communicator over the group's global ranks,
    which are MPI_COMM_WORLD ranks (neoxlab.run.dist exports RANK from MPI)."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    ranks = list(options.global_ranks_in_group) or list(range(world.Get_size()))
    if dist.is_initialized() and dist.get_rank() != world.Get_rank():
        raise RuntimeError(
            f"torch rank {dist.get_rank()} is MPI rank {world.Get_rank()}: the {BACKEND} "
            "backend needs ranks numbered by MPI (start them with mpiexec/jsrun/srun)")
    group = world.Get_group().Incl(ranks)
    comm = world.Create_group(group)
    group.Free()
    if comm.Get_rank() != options.group_rank:
        raise RuntimeError(f"MPI communicator rank {comm.Get_rank()} != group rank "
                           f"{options.group_rank}")
    return MpiProcessGroup(comm)


def register() -> str:
    """Make `backend="mpi4py"` known to torch.distributed (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, extended_api=True,
                                      devices=["cpu", "cuda"])
    return BACKEND


def new_group(ranks: Sequence[int], factory: Callable = dist.new_group, **kwargs):
    """A torch group over `ranks` on MPI (every rank of the job calls it, as new_group)."""
    register()
    return factory(ranks=list(ranks), backend=BACKEND, **kwargs)
