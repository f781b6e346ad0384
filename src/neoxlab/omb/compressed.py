"""Compressed collectives for the micro-benchmarks: the very implementation training uses.

Every op calls neoxlab.comm.collectives (fixed-size payloads, one all-to-all plus one
all-gather for all-reduces, decoded-everywhere broadcast, one payload per message), over
torch.distributed for the torch backend and over mpi4py, behind the same torch.distributed-
shaped surface (MpiRaw), for the MPI backend. The timed call includes encoding and decoding,
so latency and bandwidth are effective values on the uncompressed bytes.

Validation: lossless compressors must reproduce the uncompressed result bit for bit. A
lossy result passes when every element is within the sum, over the contributions that make
it, of that contribution's largest round-trip error |decode(encode(x)) - x| (each rank
recomputes it locally from the known input), plus float rounding of the summation
(n * eps * sum of max |x|). The all-to-all all-reduce of groups above two ranks re-encodes
the sums once more, so its bound adds the sum's own round-trip error, and doubles the whole
because chunks are encoded on their own. Misrouted or corrupted data lands far outside.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from .context import Ctx
from .pt2pt import peer_of
from .timing import Op
from .verify import SMOOTH_PERIOD, matches

ROOT = 0


def load_compressor(spec: str) -> Any:
    """Import neoxlab.compress only when --compress is used."""
    # deferred: neoxlab.compress needs torch, only --compress does
    from neoxlab.compress import make_compressor

    return make_compressor(spec)


class Tolerance:
    """Per-contribution round-trip errors of a lossy compressor on the known inputs."""

    def __init__(self, ctx: Ctx):
        self.ctx, self.cache = ctx, {}
        self.lossless = bool(getattr(ctx.compressor, "lossless", False))
        self.eps = float(np.finfo(ctx.dt.numpy).eps)

    def error(self, count: int, seed: int, it: int, start: int = 0, length: int | None = None):
        key = (count, seed, it % SMOOTH_PERIOD, start, length)
        if key not in self.cache:
            # deferred: torch, only for torch buffers or --compress
            import torch

            x = self.ctx.patterns.data(count, seed, it)[start:None if length is None
                                                          else start + length]
            t = torch.from_numpy(x.copy()).to(self.ctx.kind.dev)  # same device as the run
            y = self.roundtrip(t)
            err = float(np.abs(y.astype(np.float64) - x).max()) if x.size else 0.0
            self.cache[key] = (err, float(np.abs(x).max()) if x.size else 0.0)
        return self.cache[key]

    def roundtrip(self, t: Any) -> np.ndarray:
        """decode(encode(t)) as the collectives send it: a fixed-size payload where the
        codec has one (it never falls back to raw bytes), else a self-describing buffer."""
        # deferred: torch, only for torch buffers or --compress
        from neoxlab.comm.payload import ChunkCodec

        codec = ChunkCodec(self.ctx.compressor, t.numel(), t.dtype)
        return codec.decode(codec.encode(t), t.clone()).cpu().numpy().reshape(-1)

    def total_error(self, count: int, n: int, it: int) -> float:
        """Round-trip error of the exact sum over n ranks (the re-encoded sum's error)."""
        key = ("total", count, n, it % SMOOTH_PERIOD)
        if key not in self.cache:
            # deferred: torch, only for torch buffers or --compress
            import torch

            x = self.ctx.patterns.total(count, list(range(n)), it)
            t = torch.from_numpy(np.ascontiguousarray(x).astype(self.ctx.dt.numpy))
            y = self.roundtrip(t.to(self.ctx.kind.dev))
            self.cache[key] = float(np.abs(y.astype(np.float64) - x).max()) if x.size else 0.0
        return self.cache[key]

    def bound(self, parts: list[tuple[float, float]]) -> float | None:
        """None (exact) for lossless; else summed errors plus summation rounding."""
        if self.lossless:
            return None
        return sum(e for e, _ in parts) + len(parts) * self.eps * sum(m for _, m in parts) * 2


class MpiRaw:
    """torch.distributed's collective signatures over an mpi4py communicator, for the
    payload-sized uint8 and int64 tensors compressed collectives exchange (host tensors
    through NumPy views; device tensors as they are, for a CUDA-aware MPI)."""

    def __init__(self, comm: Any):
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        self.comm, self.MPI = comm, MPI

    @staticmethod
    def _buf(t: Any) -> Any:
        return t.numpy() if t.device.type == "cpu" else t

    def all_gather_into_tensor(self, output, input, group=None, async_op=False):
        self.comm.Allgather(self._buf(input), self._buf(output))

    def all_to_all_single(self, output, input, output_split_sizes=None,
                          input_split_sizes=None, group=None, async_op=False):
        if output_split_sizes is None:
            self.comm.Alltoall(self._buf(input), self._buf(output))
            return
        sd = np.cumsum([0, *input_split_sizes[:-1]]).tolist()
        rd = np.cumsum([0, *output_split_sizes[:-1]]).tolist()
        self.comm.Alltoallv([self._buf(input), (list(input_split_sizes), sd), self.MPI.BYTE],
                            [self._buf(output), (list(output_split_sizes), rd), self.MPI.BYTE])

    def broadcast(self, tensor, src, group=None, async_op=False):
        self.comm.Bcast(self._buf(tensor), root=src)

    def send(self, tensor, dst, group=None, tag=0):
        self.comm.Send(self._buf(tensor), dest=dst, tag=7)

    def recv(self, tensor, src=None, group=None, tag=0):
        self.comm.Recv(self._buf(tensor), source=src, tag=7)


def raw_collectives(ctx: Ctx) -> Any:
    """The plain collectives the compressed ones run on, for this run's backend."""
    if ctx.backend.name == "mpi":
        return MpiRaw(ctx.backend.comm)
    # deferred: torch, only for torch buffers or --compress
    import torch.distributed as dist

    return SimpleNamespace(**{op: getattr(dist, op) for op in (
        "all_gather_into_tensor", "all_to_all_single", "broadcast", "send", "recv")})


def _fillers(ctx: Ctx, x, res, injector: int):
    """Input for iteration `it` (and the result reset to a sentinel), or priming data."""
    def fill(it: int) -> None:
        ctx.write(x, ctx.source(x.numel(), ctx.rank, it, injector))
        ctx.write(res, ctx.patterns.sentinel(res.numel()))

    def prime() -> None:
        ctx.write(x, ctx.patterns.data(x.numel(), ctx.rank, 0))

    return fill, prime


def _check(ctx: Ctx, got, expected: np.ndarray, tol: float | None) -> bool:
    return matches(got.detach().cpu().numpy().reshape(-1), expected, tol)


def allreduce(ctx: Ctx, count: int) -> Op:
    # deferred: torch, only for torch buffers or --compress
    from neoxlab.comm import collectives as cc
    from neoxlab.comm.patch import SMALL_GROUP

    comp, n, tol, raw = ctx.compressor, ctx.size, Tolerance(ctx), raw_collectives(ctx)
    algorithm = "allgather" if n <= SMALL_GROUP else "alltoall"
    x, res = ctx.alloc(count), ctx.alloc(count)
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        res.copy_(x)
        counters["wire"] = cc.all_reduce(raw, comp, res, None, n, algorithm=algorithm).bytes_out

    def check(it: int) -> bool:
        expected = ctx.patterns.total(count, list(range(n)), it)
        bound = tol.bound([tol.error(count, j, it) for j in range(n)])
        if bound is not None and algorithm == "alltoall":
            bound = 2 * (bound + tol.total_error(count, n, it))
        return _check(ctx, res, expected, bound)

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def allgather(ctx: Ctx, count: int) -> Op:
    # deferred: torch, only for torch buffers or --compress
    from neoxlab.comm import collectives as cc

    comp, n, tol, raw = ctx.compressor, ctx.size, Tolerance(ctx), raw_collectives(ctx)
    x, res = ctx.alloc(count), ctx.alloc(count * n)
    blocks = list(res.split(count))
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        counters["wire"] = cc.all_gather_into(raw, comp, x, blocks, None, n).bytes_out

    def check(it: int) -> bool:
        got = res.detach().cpu().numpy()
        for j in range(n):
            expected = ctx.patterns.data(count, j, it)
            bound = tol.bound([tol.error(count, j, it)])
            if not matches(got[j * count:(j + 1) * count], expected, bound):
                return False
        return True

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def reduce_scatter(ctx: Ctx, count: int) -> Op:
    """Equal blocks (input padded up to a multiple of the rank count, as torch needs)."""
    # deferred: torch, only for torch buffers or --compress
    from neoxlab.comm import collectives as cc

    comp, n, rank, tol = ctx.compressor, ctx.size, ctx.rank, Tolerance(ctx)
    raw = raw_collectives(ctx)
    block = max(1, -(-count // n))
    total = block * n
    x, res = ctx.alloc(total), ctx.alloc(block)
    counters = {"bytes": total * ctx.dt.itemsize, "wire": 0}

    def call() -> None:
        counters["wire"] = cc.reduce_scatter(raw, comp, x, res, None, n).bytes_out

    def check(it: int) -> bool:
        expected = ctx.patterns.total(total, list(range(n)), it, rank * block, block)
        bound = tol.bound([tol.error(total, j, it, rank * block, block) for j in range(n)])
        return _check(ctx, res, expected, bound)

    fill, prime = _fillers(ctx, x, res, injector=n - 1)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def bcast(ctx: Ctx, count: int) -> Op:
    """The root takes the decoded values too (replicas stay identical), as in training."""
    # deferred: torch, only for torch buffers or --compress
    from neoxlab.comm import collectives as cc

    comp, tol, raw = ctx.compressor, Tolerance(ctx), raw_collectives(ctx)
    root = ctx.rank == ROOT
    x = ctx.alloc(count)
    counters = {"bytes": count * ctx.dt.itemsize if root else 0, "wire": 0}

    def call() -> None:
        wire = cc.broadcast(raw, comp, x, ROOT, ctx.rank, None).bytes_out
        counters["wire"] = wire if root else 0

    def fill(it: int) -> None:
        if root:
            ctx.write(x, ctx.source(count, ROOT, it, injector=ROOT))
        else:
            ctx.write(x, ctx.patterns.sentinel(count))

    def prime() -> None:
        ctx.write(x, ctx.patterns.data(count, ROOT, 0))

    def check(it: int) -> bool:
        expected = ctx.patterns.data(count, ROOT, it)
        return _check(ctx, x, expected, tol.bound([tol.error(count, ROOT, it)]))

    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters)


def latency(ctx: Ctx, count: int) -> Op:
    # deferred: torch, only for torch buffers or --compress
    from neoxlab.comm import collectives as cc

    comp, tol, raw = ctx.compressor, Tolerance(ctx), raw_collectives(ctx)
    peer = peer_of(ctx.rank, ctx.size)
    first = ctx.rank < peer
    x, res = ctx.alloc(count), ctx.alloc(count)
    counters = {"bytes": count * ctx.dt.itemsize, "wire": 0}

    def send() -> None:
        counters["wire"] = cc.send(raw, comp, x, peer).bytes_out

    def recv() -> None:
        cc.recv(raw, comp, res, peer)

    def call() -> None:
        if first:
            send()
            recv()
        else:
            recv()
            send()

    def check(it: int) -> bool:
        expected = ctx.patterns.data(count, peer, it)
        return _check(ctx, res, expected, tol.bound([tol.error(count, peer, it)]))

    fill, prime = _fillers(ctx, x, res, injector=0)
    return Op(call=call, fill=fill, check=check, prime=prime, counters=counters, divisor=2,
              timed=first)


def build(ctx: Ctx, size: int) -> Op:
    count = size // ctx.dt.itemsize
    builders = {"allreduce": allreduce, "allgather": allgather, "reduce_scatter": reduce_scatter,
                "bcast": bcast, "latency": latency}
    return builders[ctx.opts.benchmark](ctx, count)
