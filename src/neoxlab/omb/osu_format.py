"""Rows and their output: OSU-layout tables (so existing OSU parsers read them), CSV, JSON,
and ``parse_table``, which reads OSU-layout tables back (ours, OSU's, the native reference's).

Bandwidth conventions: OSU's MB/s for bw/bibw (MB = 10^6 B); nccl-tests' algbw = bytes /
time and busbw = algbw x factor for collectives (GB = 10^9 B), with bytes the whole buffer a
rank ends up with (size x ranks for allgather, alltoall, gather and scatter).
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import version

from .mpistart import StartMode, started_mode
from .options import DTYPES, OSU_VERSION, PT2PT, REDUCTIONS, OmbOptions, skipped_below

SIZE_WIDTH, FIELD_WIDTH = 10, 20
BLOCKED = ("allgather", "alltoall", "gather", "scatter")  # size is per rank block

TITLES = {
    "latency": "Latency", "multi_lat": "Multi Latency", "bw": "Bandwidth",
    "bibw": "Bi-Directional Bandwidth", "allreduce": "Allreduce Latency",
    "allgather": "Allgather Latency", "alltoall": "All-to-All Personalized Exchange Latency",
    "bcast": "Broadcast Latency", "barrier": "Barrier Latency", "gather": "Gather Latency",
    "reduce": "Reduce Latency", "reduce_scatter": "Reduce_scatter Latency",
    "scatter": "Scatter Latency",
}


@dataclass
class Row:
    """One message size, aggregated over ranks (avg/min/max of each rank's average time).

    Compressed runs: avg_us is the effective time (compression included); algbw/busbw are
    on the bytes on the wire, effective_busbw_GBps on the uncompressed bytes.
    """

    size: int
    avg_us: float
    min_us: float
    max_us: float
    iterations: int  # timed iterations per rank
    ranks: int  # world size of the run
    algbw_GBps: float | None = None
    busbw_GBps: float | None = None
    bandwidth_MBps: float | None = None  # bw and bibw only
    validation: str | None = None  # "Pass" / "Fail" with --validate
    compression_ratio: float | None = None
    effective_busbw_GBps: float | None = None


def busbw_factor(benchmark: str, n: int) -> float | None:
    """nccl-tests bus-bandwidth factors; None where no data moves (barrier)."""
    if benchmark == "barrier":
        return None
    if benchmark == "allreduce":
        return 2 * (n - 1) / n
    if benchmark in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0  # bcast, reduce and point-to-point


def algbw_bytes(benchmark: str, size: int, n: int) -> int:
    return size * n if benchmark in BLOCKED else size


def make_row(opts: OmbOptions, size: int, ranks: int, avg_us: float, min_us: float,
             max_us: float, iterations: int, ok: bool | None = None,
             ratio: float | None = None) -> Row:
    row = Row(size, avg_us, min_us, max_us, iterations, ranks)
    if ok is not None:
        row.validation = "Pass" if ok else "Fail"
    factor = busbw_factor(opts.benchmark, ranks)
    if factor is None or avg_us <= 0:
        return row
    if opts.benchmark in ("bw", "bibw"):
        moved = size * (2 if opts.benchmark == "bibw" else 1)
        row.bandwidth_MBps = moved / avg_us  # bytes per microsecond == 10^6 bytes per second
        row.algbw_GBps = row.busbw_GBps = row.bandwidth_MBps / 1e3
        return row
    alg = algbw_bytes(opts.benchmark, size, ranks) / avg_us / 1e3
    row.algbw_GBps, row.busbw_GBps = alg, alg * factor
    if ratio is not None:
        row.compression_ratio = ratio
        row.effective_busbw_GBps = row.busbw_GBps
        if ratio > 0:
            row.algbw_GBps, row.busbw_GBps = alg / ratio, alg * factor / ratio
    return row


def datatype_name(opts: OmbOptions) -> str:
    dt = DTYPES[opts.dtype_name]
    return "MPI_" + (dt.mpi_reduce if opts.benchmark in REDUCTIONS else dt.mpi)


def columns(opts: OmbOptions) -> list[str]:
    """Value columns after Size, in OSU order, then neoxlab's additions, Validation last."""
    bandwidth = opts.benchmark in ("bw", "bibw")
    cols = ["Bandwidth (MB/s)"] if bandwidth else ["Avg Latency(us)"]
    if opts.full:
        cols += ([] if bandwidth else ["Min Latency(us)", "Max Latency(us)"]) + ["Iterations"]
    if opts.compress:
        cols += ["Compression Ratio", "Eff BusBW(GB/s)"]
    if opts.validate:
        cols += ["Validation"]
    return cols


def _cells(row: Row, opts: OmbOptions) -> list[str]:
    values = {
        "Bandwidth (MB/s)": row.bandwidth_MBps, "Avg Latency(us)": row.avg_us,
        "Min Latency(us)": row.min_us, "Max Latency(us)": row.max_us,
        "Iterations": row.iterations, "Compression Ratio": row.compression_ratio,
        "Eff BusBW(GB/s)": row.effective_busbw_GBps, "Validation": row.validation,
    }
    out = []
    for col in columns(opts):
        v = values[col]
        if isinstance(v, float):
            out.append(f"{v:>{FIELD_WIDTH}.2f}")
        else:
            out.append(f"{'-' if v is None else v:>{FIELD_WIDTH}}")
    return out


def _version() -> str:
    try:
        return version("neoxlab")
    except Exception:  # not installed (source checkout on sys.path)
        return "dev"


def mpi_thread_level() -> str | None:
    """The thread level MPI provides in this process, or None before MPI is initialized."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    names = {mpi.THREAD_SINGLE: "single", mpi.THREAD_FUNNELED: "funneled",
             mpi.THREAD_SERIALIZED: "serialized", mpi.THREAD_MULTIPLE: "multiple"}
    return names.get(mpi.Query_thread(), str(mpi.Query_thread()))


def timing_note(opts: OmbOptions) -> str:
    """How the numbers were timed, so a reader can tell them from OSU's own."""
    if opts.timing == "loop":
        return "# Timing: one clock around all timed calls (not OSU 7.4's per-call clock)."
    if opts.benchmark in PT2PT:
        unit = "round trip" if opts.benchmark in ("latency", "multi_lat") else "window"
        return f"# Timing: as OSU {OSU_VERSION}, a clock around each {unit}."
    return (f"# Timing: as OSU {OSU_VERSION}, a clock around each call, then a barrier "
            "outside the clock.")


def notes(opts: OmbOptions, thread_level: str | None = None,
          mode: StartMode | None = None) -> list[str]:
    """Header lines that say where this run differs from, or follows, OSU's defaults."""
    level = thread_level or mpi_thread_level()
    mode = mode or started_mode()
    out = [timing_note(opts)]
    if level is not None:
        out.append(f"# MPI thread level: {level}"
                   + (" (as OSU's MPI_Init)." if level == "single" else
                      " (OSU runs at single; --thread-level single for its numbers)."))
    oversubscribed = mode.note() if mode else None
    if oversubscribed:
        out.append(oversubscribed)
    if opts.dtype is None and opts.dtype_name != "char" and opts.benchmark != "barrier":
        out.append(f"# Datatype differs from OSU {OSU_VERSION} (MPI_CHAR): "
                   "pass -T char for OSU's default.")
    item = skipped_below(opts)
    if item is not None:
        out.append(f"# Sizes start at {item} B, one {opts.dtype_name} element: smaller ones "
                   "are skipped, as OSU does.")
    return out


def table_header(opts: OmbOptions, ranks: int, thread_level: str | None = None,
                 mode: StartMode | None = None) -> str:
    title = f"# OSU MPI {TITLES.get(opts.benchmark, opts.benchmark)} Test v{OSU_VERSION}"
    about = (f"# neoxlab {_version()} omb: backend {opts.backend}, buffer {opts.buffer}, "
             f"{ranks} ranks" + (f", compress {opts.compress}" if opts.compress else ""))
    cols = columns(opts)
    if opts.benchmark == "barrier":
        head = "# " + cols[0] + "".join(f"{c:>{FIELD_WIDTH}}" for c in cols[1:])
    else:
        head = f"{'# Size':<{SIZE_WIDTH}}" + "".join(f"{c:>{FIELD_WIDTH}}" for c in cols)
    return "\n".join([title, about, *notes(opts, thread_level, mode),
                      f"# Datatype: {datatype_name(opts)}.", head])


def table_row(row: Row, opts: OmbOptions) -> str:
    cells = "".join(_cells(row, opts))
    return cells if opts.benchmark == "barrier" else f"{row.size:<{SIZE_WIDTH}}{cells}"


def _record(row: Row, opts: OmbOptions) -> dict:
    rec = asdict(row)
    del rec["ranks"]
    if not opts.compress:
        del rec["compression_ratio"], rec["effective_busbw_GBps"]
    return rec


def format_rows(rows: list[Row], fmt: str, options: OmbOptions) -> str:
    """The whole result as an OSU table, CSV (one line per size) or one JSON object."""
    ranks = rows[0].ranks if rows else 0
    if fmt == "table":
        return "\n".join([table_header(options, ranks)] + [table_row(r, options) for r in rows])
    if fmt == "csv":
        buf = io.StringIO()
        recs = [_record(r, options) for r in rows]
        meta = {"benchmark": options.benchmark, "backend": options.backend,
                "buffer": options.buffer, "dtype": options.dtype_name, "world_size": ranks}
        fields = list(meta) + list(recs[0] if recs else _record(Row(0, 0, 0, 0, 0, 0), options))
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for rec in recs:
            writer.writerow({**meta, **{k: ("" if v is None else v) for k, v in rec.items()}})
        return buf.getvalue().rstrip("\n")
    if fmt == "json":
        return json.dumps({
            "tool": f"neoxlab {_version()}", "osu_version": OSU_VERSION,
            "benchmark": options.benchmark, "backend": options.backend,
            "buffer": options.buffer, "dtype": options.dtype_name,
            "datatype": datatype_name(options), "world_size": ranks,
            "compress": options.compress, "validate": options.validate,
            "timing": options.timing, "thread_level": mpi_thread_level(),
            "start_mode": mode.record() if (mode := started_mode()) else None,
            "rows": [_record(r, options) for r in rows],
        }, indent=2)
    raise ValueError(f"format {fmt!r}: unknown output format; use table, csv or json")


Cell = int | float | str | None


def _cell(text: str) -> Cell:
    # deferred: neoxlab.compress needs torch, only --compress does
    from neoxlab.compress.registry import parse_value

    return None if text == "-" else parse_value(text)


def parse_table(text: str) -> list[dict[str, Cell]]:
    """Data rows of an OSU-layout table as {column: value}; "-" cells are None.

    The header is the last '#' line before the first data line; column names are split on
    runs of two or more blanks (names such as "Avg Latency(us)" hold single blanks). Raises
    ValueError when there is no header or a row's field count does not match it.
    """
    columns: list[str] | None = None
    last_comment = None
    rows: list[dict[str, Cell]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            last_comment = line
            continue
        if columns is None:
            if last_comment is None:
                raise ValueError(f"line {number}: data before any '# ...' header line; "
                                 "an OSU table starts with its header")
            columns = [c for c in re.split(r"\s{2,}", last_comment.lstrip("#").strip()) if c]
        fields = line.split()
        if len(fields) != len(columns):
            raise ValueError(f"line {number}: {len(fields)} fields under {len(columns)} "
                             f"columns {columns}: {line!r}")
        rows.append({c: _cell(f) for c, f in zip(columns, fields, strict=True)})
    return rows
