"""Benchmark options, OSU defaults and the checks that run before any communication.

Every rule lives here so that a bad command line fails on every rank at once, with the bad
value, the rule and the fix, and no rank is left waiting in a collective.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

OSU_VERSION = "7.4"
LARGE_MESSAGE_BYTES = 8192  # OSU: sizes above this use the "large" iteration counts
DEFAULT_WINDOW = 64

PT2PT = ("latency", "bw", "bibw", "multi_lat")
COLLECTIVES = (
    "allreduce", "allgather", "alltoall", "bcast", "barrier",
    "gather", "reduce", "reduce_scatter", "scatter",
)
BENCHMARKS = PT2PT + COLLECTIVES
REDUCTIONS = ("allreduce", "reduce", "reduce_scatter")
PAIR_ONLY = ("latency", "bw", "bibw")  # exactly two ranks, as in OSU
COMPRESSIBLE = ("allreduce", "allgather", "reduce_scatter", "bcast", "latency")
BUFFERS = ("bytearray", "numpy", "torch", "cuda", "cupy", "numba")
TORCH_BUFFERS = ("torch", "cuda")
BACKENDS = ("mpi", "torch")
FORMATS = ("table", "csv", "json")
TIMINGS = ("osu", "loop")  # per-call clock as OSU 7.4, or one clock around the whole loop
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
DEFAULT_THREAD_LEVEL = "single"  # OSU calls MPI_Init, which gives MPI_THREAD_SINGLE


@dataclass(frozen=True)
class DType:
    """One element type: its numpy spelling and the MPI names used for plain and reduction ops."""

    name: str
    numpy: str
    mpi: str  # MPI datatype for data movement
    mpi_reduce: str  # MPI datatype for reductions (MPI_CHAR is not valid with MPI_SUM)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.numpy).itemsize


DTYPES = {
    "char": DType("char", "int8", "CHAR", "SIGNED_CHAR"),
    "int": DType("int", "int32", "INT", "INT"),
    "float": DType("float", "float32", "FLOAT", "FLOAT"),
    "double": DType("double", "float64", "DOUBLE", "DOUBLE"),
}
FLOAT_DTYPES = ("float", "double")


class OptionError(ValueError):
    """Bad options: the message names each bad value, the rule and the fix (exit code 2)."""


@dataclass
class OmbOptions:
    """What to measure and how; None means "the OSU default for this benchmark"."""

    benchmark: str = "latency"
    buffer: str = "numpy"
    backend: str = "mpi"
    dtype: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    iterations: int | None = None
    warmup: int | None = None
    validate: bool = False
    full: bool = False
    barrier: bool = False
    fmt: str = "table"
    compress: str | None = None
    skip_unavailable: bool = False
    window: int = DEFAULT_WINDOW
    inject_error: bool = False  # testing aid: corrupt one element so --validate must fail
    timing: str = "osu"  # "osu": clock around each call; "loop": one clock around all calls
    thread_level: str | None = None  # MPI thread level the CLI asks for (None: single)

    @property
    def dtype_name(self) -> str:
        """Reductions and compressed runs default to float (as OSU 5-6 and training
        gradients), everything else to char. OSU 7.4 reduces MPI_CHAR by default, 4x the
        elements per byte; MPICH's reduction loop costs about the same per element either
        way, so -T char is what matches osu_allreduce's own default table."""
        if self.dtype is not None:
            return self.dtype
        return "float" if self.benchmark in REDUCTIONS or self.compress else "char"

    @property
    def is_pt2pt(self) -> bool:
        return self.benchmark in PT2PT


def default_size_range(opts: OmbOptions) -> tuple[int, int]:
    """OSU ranges: pt2pt 0 B..4 MiB, collectives 1 B (4 B reductions)..1 MiB, >= one element."""
    if opts.is_pt2pt:
        return (DTYPES[opts.dtype_name].itemsize if opts.compress else 0), 4 << 20
    item = DTYPES[opts.dtype_name].itemsize if opts.dtype_name in DTYPES else 1
    low = 4 if opts.benchmark in REDUCTIONS else 1
    return max(low, item), 1 << 20


def size_range(opts: OmbOptions) -> tuple[int, int]:
    lo, hi = default_size_range(opts)
    return (lo if opts.min_size is None else opts.min_size,
            hi if opts.max_size is None else opts.max_size)


def skipped_below(opts: OmbOptions) -> int | None:
    """The element size when -m asks for smaller messages (OSU skips those), else None."""
    item = DTYPES[opts.dtype_name].itemsize
    lo = size_range(opts)[0]
    return item if opts.benchmark != "barrier" and 0 < lo < item else None


def message_sizes(opts: OmbOptions) -> list[int]:
    """Powers of two from min to max (0 first when min is 0); barrier has one size-less row.

    Sizes below one element are skipped, as OSU does: -m 1:4096 with floats starts at 4 B.
    """
    if opts.benchmark == "barrier":
        return [0]
    lo, hi = size_range(opts)
    sizes = [0] if lo == 0 else []
    size = max(lo, DTYPES[opts.dtype_name].itemsize)  # pt2pt: 0 B, then whole elements
    while size <= hi:
        sizes.append(size)
        size *= 2
    return sizes


def iterations_for(opts: OmbOptions, size: int) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for one size, OSU 7 defaults unless overridden."""
    large = size > LARGE_MESSAGE_BYTES
    if opts.benchmark in ("latency", "multi_lat"):
        iters, warm = (1000, 10) if large else (10000, 100)
    elif opts.benchmark in ("bw", "bibw"):
        iters, warm = (20, 2) if large else (100, 10)
    else:
        iters, warm = (100, 10) if large else (1000, 100)
    if opts.iterations is not None:
        iters = opts.iterations
    if opts.warmup is not None:
        warm = opts.warmup
    return iters, warm


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_options(opts: OmbOptions, world_size: int) -> None:
    """Raise OptionError listing every violated rule; needs no communication (size is local)."""
    errs: list[str] = []

    def bad(value: str, rule: str, fix: str) -> None:
        errs.append(f"{value}: {rule}; {fix}")

    for flag, value, allowed, what in (
        ("benchmark", opts.benchmark, BENCHMARKS, "benchmark"),
        ("--buffer", opts.buffer, BUFFERS, "buffer"),
        ("--backend", opts.backend, BACKENDS, "backend"),
        ("--format", opts.fmt, FORMATS, "format"),
        ("--dtype", opts.dtype_name, tuple(DTYPES), "datatype"),
    ):
        if value not in allowed:
            bad(f"{flag} {value!r}", f"unknown {what}", f"choose one of {', '.join(allowed)}")
    if errs:
        raise OptionError("\n".join(errs))

    _check_sizes(opts, bad)
    if opts.iterations is not None and opts.iterations < 1:
        bad(f"-i {opts.iterations}", "iterations must be at least 1", "pass -i 1 or more")
    if opts.warmup is not None and opts.warmup < 0:
        bad(f"-x {opts.warmup}", "warm-up iterations cannot be negative", "pass -x 0 or more")
    if opts.timing not in TIMINGS:
        bad(f"--timing {opts.timing!r}", "unknown timing method",
            "use osu (a clock around each call, as OSU 7.4) or loop (one around all calls)")
    if opts.thread_level is not None and opts.thread_level not in THREAD_LEVELS:
        bad(f"--thread-level {opts.thread_level!r}", "unknown MPI thread level",
            f"choose one of {', '.join(THREAD_LEVELS)}")
    if opts.window < 1:
        bad(f"--window {opts.window}", "the window must hold at least one message",
            "pass -W 1 or more")
    _check_world(opts, world_size, bad)
    if opts.backend == "torch" and opts.buffer not in TORCH_BUFFERS:
        bad(f"--buffer {opts.buffer} with --backend torch",
            "torch.distributed moves torch tensors only", "use --buffer torch (or cuda)")
    if opts.compress is not None:
        _check_compress(opts, bad)
    if errs:
        raise OptionError("\n".join(errs))


def _check_sizes(opts: OmbOptions, bad) -> None:
    lo, hi = size_range(opts)
    item = DTYPES[opts.dtype_name].itemsize

    def down(v: int) -> int:  # the power of two at or below v (0 stays 0 for pt2pt)
        return 0 if v == 0 and opts.is_pt2pt else 1 << max(v, 1).bit_length() - 1

    for flag, value in (("minimum", lo), ("maximum", hi)):
        if value == 0 and flag == "minimum" and opts.is_pt2pt:
            continue
        if not _is_pow2(value):
            bad(f"{flag} message size {value}", "message sizes are powers of two"
                + (" (0 allowed as point-to-point minimum)" if opts.is_pt2pt else ""),
                f"use e.g. -m {down(lo)}:{down(hi)}")
    if lo > hi:
        bad(f"-m {lo}:{hi}", "the minimum size is larger than the maximum", f"use -m {hi}:{lo}")
    if opts.benchmark != "barrier" and 0 < hi < item:
        bad(f"maximum message size {hi} B", f"smaller than one {opts.dtype_name} element "
            f"({item} B), so no size is left to measure", f"use -m {lo}:{item} or more, "
            "or --dtype char")


def _check_world(opts: OmbOptions, n: int, bad) -> None:
    if opts.benchmark in PAIR_ONLY and n != 2:
        bad(f"{opts.benchmark} with {n} rank{'s' * (n != 1)}",
            "this benchmark runs on exactly two ranks",
            "launch with mpiexec -n 2 (or use multi_lat for many pairs)")
    elif opts.benchmark == "multi_lat" and (n < 2 or n % 2):
        bad(f"multi_lat with {n} ranks", "ranks pair up, so the count must be even",
            "launch with an even -n")
    elif opts.benchmark in COLLECTIVES and n < 2:
        bad(f"{opts.benchmark} with 1 rank", "collectives need at least two ranks",
            "launch with mpiexec -n 2 or more")


def _check_compress(opts: OmbOptions, bad) -> None:
    if opts.benchmark not in COMPRESSIBLE:
        bad(f"--compress with {opts.benchmark}", "compressed variants exist for "
            + ", ".join(COMPRESSIBLE), "drop --compress or pick one of those")
    if opts.buffer not in TORCH_BUFFERS:
        bad(f"--compress with --buffer {opts.buffer}", "compressors work on torch tensors",
            "use --buffer torch (or cuda)")
    if opts.dtype_name not in FLOAT_DTYPES:
        bad(f"--compress with --dtype {opts.dtype_name}", "compressors take float data",
            "use --dtype float or double")
    elif size_range(opts)[0] == 0:
        bad("minimum message size 0 B with --compress",
            "a compressed message holds at least one element",
            f"use -m {DTYPES[opts.dtype_name].itemsize}:{size_range(opts)[1]}")


def parse_size_range(text: str) -> tuple[int | None, int]:
    """OSU's -m: "MAX", "MIN:MAX" or "MIN:" (then MAX stays default)."""
    lo_s, sep, hi_s = text.partition(":")
    try:
        if not sep:
            return None, int(text)
        return int(lo_s), (int(hi_s) if hi_s else None)
    except ValueError:
        raise OptionError(f"-m {text!r}: sizes are integers in bytes as MIN:MAX; "
                          "use e.g. -m 4:1048576") from None


def _dtype_name(text: str) -> str:
    """OSU's -T spelling (mpi_float) or ours (float); unknown names fail in check_options."""
    low = text.lower()
    return low[4:] if low.startswith("mpi_") else low


class _Parser(argparse.ArgumentParser):
    """argparse that raises OptionError instead of printing on every rank and exiting."""

    def error(self, message: str):  # noqa: D102 (argparse API)
        raise OptionError(f"{message}; see python -m neoxlab.omb --help")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m neoxlab.omb",
                description="OSU-compatible micro-benchmarks for mpi4py, torch.distributed "
                            "and compressed collectives. Run under mpiexec.",
                epilog="example: mpiexec -n 4 python -m neoxlab.omb allreduce --buffer torch "
                       "--compress zfp:rate=8 --validate --full --format json")
    p.add_argument("benchmark", help=", ".join(BENCHMARKS))
    p.add_argument("--buffer", "-b", default="numpy", help=", ".join(BUFFERS))
    p.add_argument("--backend", default="mpi", help="mpi (mpi4py) or torch (torch.distributed)")
    p.add_argument("--dtype", "-T", default=None, type=_dtype_name,
                   help="char, int, float, double; OSU's mpi_char, mpi_int, mpi_float too "
                   "(default: float for reductions and compressed runs, else char; "
                   "OSU 7.4 uses MPI_CHAR everywhere)")
    p.add_argument("-m", "--message-size", dest="sizes", default=None, help="[MIN:]MAX bytes")
    p.add_argument("-i", "--iterations", type=int, default=None, help="timed iterations")
    p.add_argument("-x", "--warmup", type=int, default=None, help="warm-up iterations")
    p.add_argument("-W", "--window", type=int, default=DEFAULT_WINDOW, help="bw/bibw window")
    p.add_argument("-c", "--validate", action="store_true", help="check every result")
    p.add_argument("-f", "--full", action="store_true", help="min/max latency and iterations")
    p.add_argument("--barrier", action="store_true",
                   help="also a barrier before every call (outside the clock)")
    p.add_argument("--timing", default="osu", help="osu (default): a clock around each call "
                   "and, for collectives, a barrier after it, as OSU 7.4; loop: one clock "
                   "around all calls (OMB-Py, OSU 5)")
    p.add_argument("--thread-level", default=None, help="MPI thread level: single (default, "
                   "as OSU), funneled, serialized or multiple (mpi4py's own default); "
                   "$MPI4PY_RC_THREAD_LEVEL when not given")
    p.add_argument("--format", dest="fmt", default="table", help="table, csv or json")
    p.add_argument("--compress", default=None, help="compressor spec, e.g. zfp:rate=8")
    p.add_argument("--skip-unavailable", action="store_true",
                   help="exit 0 when the buffer kind is not available here")
    p.add_argument("--inject-error", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> OmbOptions:
    ns = build_parser().parse_args(argv)
    lo, hi = parse_size_range(ns.sizes) if ns.sizes else (None, None)
    return OmbOptions(
        benchmark=ns.benchmark, buffer=ns.buffer, backend=ns.backend, dtype=ns.dtype,
        min_size=lo, max_size=hi, iterations=ns.iterations, warmup=ns.warmup,
        validate=ns.validate, full=ns.full, barrier=ns.barrier, fmt=ns.fmt,
        compress=ns.compress, skip_unavailable=ns.skip_unavailable, window=ns.window,
        inject_error=ns.inject_error, timing=ns.timing, thread_level=ns.thread_level,
    )
