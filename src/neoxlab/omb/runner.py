"""Run a benchmark over its message sizes and aggregate each size over the ranks.

This is the Python entry the harness uses; the CLI is a thin shell around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import collectives, compressed, pt2pt
from .backends import make_backend
from .buffers import get_buffer_kind
from .context import Ctx
from .options import (
    DTYPES,
    PT2PT,
    REDUCTIONS,
    OmbOptions,
    OptionError,
    check_options,
    iterations_for,
    message_sizes,
)
from .osu_format import Row, make_row
from .timing import Op, measure
from .verify import Patterns

GPU_BUFFERS = ("cuda", "cupy", "numba")


def _local_rank(comm: Any) -> int:
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank()
    finally:
        local.Free()


def _compressor(spec: str) -> Any:
    """The compressor for --compress, with failures turned into option errors (exit 2)."""
    try:
        return compressed.load_compressor(spec)
    except ImportError as exc:
        raise OptionError(f"--compress {spec!r}: neoxlab.compress cannot be imported ({exc}); "
                          "install it or drop --compress") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise OptionError(f"--compress {spec!r}: not a valid compressor spec ({exc}); "
                          "use e.g. zfp:rate=8 or mpc") from None


def _build(ctx: Ctx, size: int) -> Op:
    if ctx.compressor is not None:
        return compressed.build(ctx, size)
    if ctx.opts.benchmark in PT2PT:
        return pt2pt.build(ctx, size)
    return collectives.build(ctx, size)


def _aggregate(comm: Any, opts: OmbOptions, op: Op, size: int, iters: int,
               seconds: float, ok: bool) -> Row:
    """avg/min/max of each timed rank's average time; Fail if any rank failed a check.

    Point-to-point times count on the rank that starts each exchange only (as OSU): the
    other rank's clock also holds its wait for the first message.
    """
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    us = seconds / (iters * op.divisor) * 1e6
    lo = np.array([us if op.timed else np.inf, 1.0 if ok else 0.0])
    hi = np.array([us if op.timed else -np.inf])
    total = np.array([us if op.timed else 0.0, float(op.timed),
                      op.counters.get("bytes", 0), op.counters.get("wire", 0)], dtype=float)
    comm.Allreduce(MPI.IN_PLACE, lo, MPI.MIN)
    comm.Allreduce(MPI.IN_PLACE, hi, MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, total, MPI.SUM)
    ratio = float(total[2] / total[3]) if opts.compress and total[3] > 0 else None
    return make_row(opts, size, comm.Get_size(), float(total[0] / total[1]), float(lo[0]),
                    float(hi[0]), iters, ok=bool(lo[1]) if opts.validate else None, ratio=ratio)


def iter_rows(options: OmbOptions, comm: Any = None) -> Iterator[Row]:
    """Yield one aggregated Row per message size (on every rank), as soon as it is measured.

    Raises OptionError (bad options, nothing communicated) or BufferUnavailable.
    """
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    check_options(options, comm.Get_size())
    compressor = _compressor(options.compress) if options.compress else None
    local = _local_rank(comm) if options.buffer in GPU_BUFFERS else 0
    kind = get_buffer_kind(options.buffer, local)
    dt = DTYPES[options.dtype_name]
    backend = make_backend(options.backend, comm, kind)
    patterns = Patterns(dt, comm.Get_size(), reduction=options.benchmark in REDUCTIONS,
                        smooth=compressor is not None)
    ctx = Ctx(options, backend, kind, dt, comm.Get_rank(), comm.Get_size(), patterns, compressor)
    try:
        for size in message_sizes(options):
            iters, warmup = iterations_for(options, size)
            op = _build(ctx, size)
            try:
                timing = measure(op, iters, warmup, validate=options.validate,
                                 barrier=options.barrier,
                                 sync=kind.sync if kind.device else None, comm=comm,
                                 wtime=MPI.Wtime, timing=options.timing,
                                 pace=options.benchmark not in PT2PT)
            finally:
                op.close()
            yield _aggregate(comm, options, op, size, iters, timing.seconds, timing.ok)
    finally:
        backend.shutdown()


def run_benchmark(options: OmbOptions, comm: Any = None) -> list[Row]:
    """All rows of one benchmark run; identical on every rank."""
    return list(iter_rows(options, comm))
