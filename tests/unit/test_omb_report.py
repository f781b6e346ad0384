"""neoxlab.omb, pure parts: OSU table layout, CSV/JSON, bandwidth factors, counts, options."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from neoxlab.omb import collectives, pt2pt
from neoxlab.omb.buffers import BufferKind
from neoxlab.omb.context import Ctx
from neoxlab.omb.options import (
    BENCHMARKS,
    DTYPES,
    OmbOptions,
    OptionError,
    check_options,
    iterations_for,
    message_sizes,
    parse_args,
)
from neoxlab.omb.osu_format import busbw_factor, format_rows, make_row
from neoxlab.omb.verify import Patterns


def parse_osu(text: str) -> tuple[list[str], list[list[str]]]:
    """A minimal OSU-output reader: skip '#' lines except the column header, split rows."""
    lines = text.splitlines()
    header = [ln for ln in lines if ln.startswith("# Size")]
    columns = [c.strip() for c in _fixed_fields(header[0][10:])] if header else []
    rows = [ln.split() for ln in lines if ln.strip() and not ln.startswith("#")]
    return columns, rows


def _fixed_fields(text: str, width: int = 20) -> list[str]:
    return [text[i:i + width] for i in range(0, len(text), width)]


def _rows(opts: OmbOptions, ranks: int = 2, ok: bool | None = None) -> list:
    return [make_row(opts, size, ranks, avg_us=1.0 + size / 1000, min_us=0.5, max_us=2.25,
                     iterations=1000, ok=ok) for size in (0, 1, 8, 8192, 1048576)]


def test_latency_table_has_osu_layout_and_parses_back():
    opts = OmbOptions(benchmark="latency")
    text = format_rows(_rows(opts), "table", opts)
    lines = text.splitlines()
    assert lines[0].startswith("# OSU MPI Latency Test v7.4")
    assert any("neoxlab" in ln for ln in lines if ln.startswith("#"))
    assert "# Datatype: MPI_CHAR." in lines
    assert "# Size       Avg Latency(us)".split() == [ln for ln in lines
                                                     if ln.startswith("# Size")][0].split()
    columns, rows = parse_osu(text)
    assert columns == ["Avg Latency(us)"]
    assert [int(r[0]) for r in rows] == [0, 1, 8, 8192, 1048576]
    assert [float(r[1]) for r in rows] == [1.0, 1.0, 1.01, 9.19, 1049.58]  # two decimals
    data = [ln for ln in lines if not ln.startswith("#")]
    for line, size in zip(data, (0, 1, 8, 8192, 1048576), strict=True):
        assert len(line) == 10 + 20
        assert line[:10] == f"{size:<10}"  # size left-aligned in 10 columns
        assert line[10:] == f"{float(line[10:]):>20.2f}"  # value right-aligned in 20


def test_full_and_validation_columns_follow_osu_order():
    opts = OmbOptions(benchmark="allreduce", full=True, validate=True)
    text = format_rows(_rows(opts, ranks=4, ok=True), "table", opts)
    columns, rows = parse_osu(text)
    assert columns == ["Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations",
                       "Validation"]
    assert "# Datatype: MPI_FLOAT." in text  # reductions default to float
    assert "differs from OSU 7.4 (MPI_CHAR)" in text  # and the header says OSU 7.4 differs
    assert all(len(r) == 6 and r[4] == "1000" and r[5] == "Pass" for r in rows)
    assert [float(r[2]) for r in rows] == [0.5] * 5 and [float(r[3]) for r in rows] == [2.25] * 5
    fail = format_rows([make_row(opts, 4, 4, 1, 1, 1, 10, ok=False)], "table", opts)
    assert parse_osu(fail)[1][0][-1] == "Fail"


def test_bandwidth_is_megabytes_of_ten_to_the_six():
    bw = make_row(OmbOptions(benchmark="bw"), 1_000_000, 2, 1000.0, 1000.0, 1000.0, 20)
    bibw = make_row(OmbOptions(benchmark="bibw"), 1_000_000, 2, 1000.0, 1000.0, 1000.0, 20)
    assert bw.bandwidth_MBps == pytest.approx(1000.0)  # 10^6 B per 1000 us
    assert bibw.bandwidth_MBps == pytest.approx(2000.0)
    columns, rows = parse_osu(format_rows([bw], "table", OmbOptions(benchmark="bw")))
    assert columns == ["Bandwidth (MB/s)"] and rows == [["1000000", "1000.00"]]


@pytest.mark.parametrize("name, n, factor", [
    ("allreduce", 4, 1.5), ("allreduce", 2, 1.0), ("allgather", 4, 0.75),
    ("reduce_scatter", 8, 0.875), ("alltoall", 4, 0.75), ("bcast", 4, 1.0),
    ("reduce", 16, 1.0), ("barrier", 4, None),
])
def test_busbw_factors_are_nccl_tests(name, n, factor):
    assert busbw_factor(name, n) == (None if factor is None else pytest.approx(factor))


def test_algbw_and_busbw_values():
    ar = make_row(OmbOptions(benchmark="allreduce"), 1_000_000, 4, 100.0, 90.0, 110.0, 100)
    assert ar.algbw_GBps == pytest.approx(10.0)  # 10^6 B / 100 us = 10 GB/s
    assert ar.busbw_GBps == pytest.approx(15.0)  # x 2(n-1)/n
    ag = make_row(OmbOptions(benchmark="allgather"), 1_000_000, 4, 100.0, 90.0, 110.0, 100)
    assert ag.algbw_GBps == pytest.approx(40.0)  # per-rank block x ranks
    assert ag.busbw_GBps == pytest.approx(30.0)
    comp = make_row(OmbOptions(benchmark="allreduce", compress="zfp:rate=8"), 1_000_000, 4,
                    100.0, 90.0, 110.0, 100, ratio=4.0)
    assert comp.effective_busbw_GBps == pytest.approx(15.0)  # on uncompressed bytes
    assert comp.busbw_GBps == pytest.approx(15.0 / 4)  # on the wire
    assert make_row(OmbOptions(benchmark="barrier"), 0, 4, 5.0, 5.0, 5.0, 10).busbw_GBps is None


def test_json_and_csv_carry_every_field():
    opts = OmbOptions(benchmark="allreduce", compress="mpc", validate=True, full=True)
    rows = [make_row(opts, 4096, 4, 10.0, 9.0, 11.0, 100, ok=True, ratio=1.5)]
    doc = json.loads(format_rows(rows, "json", opts))
    assert (doc["benchmark"], doc["backend"], doc["buffer"], doc["world_size"]) == \
        ("allreduce", "mpi", "numpy", 4)
    row = doc["rows"][0]
    for key in ("size", "avg_us", "min_us", "max_us", "iterations", "algbw_GBps", "busbw_GBps",
                "validation", "compression_ratio", "effective_busbw_GBps"):
        assert key in row
    assert row["validation"] == "Pass" and row["compression_ratio"] == 1.5
    plain = OmbOptions(benchmark="allreduce")
    assert "compression_ratio" not in json.loads(format_rows(rows, "json", plain))["rows"][0]
    recs = list(csv.DictReader(io.StringIO(format_rows(rows, "csv", opts))))
    assert recs[0]["size"] == "4096" and float(recs[0]["avg_us"]) == 10.0
    assert recs[0]["world_size"] == "4" and recs[0]["validation"] == "Pass"


def test_barrier_table_has_no_size_column():
    opts = OmbOptions(benchmark="barrier", full=True)
    text = format_rows([make_row(opts, 0, 4, 3.0, 2.0, 4.0, 1000)], "table", opts)
    assert "# Avg Latency(us)" in text
    assert [ln.split() for ln in text.splitlines() if not ln.startswith("#")] == \
        [["3.00", "2.00", "4.00", "1000"]]


# --- counts: every count handed to a backend is a Python int matching the byte size ------

class RecordingBackend:
    """Stands in for mpi4py/torch and records the counts each op binds."""

    in_place_reductions = False

    def __init__(self):
        self.counts: list = []

    def _bind(self, *counts):
        self.counts.extend(counts)
        return lambda: None

    def allreduce(self, s, r, count, dt):
        return self._bind(count)

    def reduce(self, s, r, count, dt, root):
        return self._bind(count)

    def reduce_scatter(self, s, r, counts, dt):
        return self._bind(*counts)

    def allgather(self, s, r, count, dt):
        return self._bind(count)

    alltoall = allgather

    def gather(self, s, r, count, dt, root):
        return self._bind(count)

    scatter = gather

    def bcast(self, buf, count, dt, root):
        return self._bind(count)

    def barrier(self):
        return self._bind()

    def send(self, buf, count, dt, peer, tag):
        return self._bind(count)

    recv = send

    def window(self, sends, recvs, dt):
        self._bind(*[m[1] for m in sends + recvs])
        return (lambda: None), (lambda: None)


@pytest.mark.parametrize("benchmark", [b for b in BENCHMARKS if b != "barrier"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_counts_are_integers(benchmark, dtype):
    ranks = 2 if benchmark in ("latency", "bw", "bibw") else 4
    opts = OmbOptions(benchmark=benchmark, dtype=dtype, max_size=4096, window=4)
    if benchmark in ("allreduce", "reduce", "reduce_scatter", "allgather", "alltoall", "bcast",
                     "gather", "scatter"):
        opts.min_size = DTYPES[dtype].itemsize
    check_options(opts, ranks)
    dt = DTYPES[dtype]
    for size in message_sizes(opts):
        be = RecordingBackend()
        ctx = Ctx(opts, be, BufferKind(), dt, 0, ranks, Patterns(dt, ranks, False))
        builder = pt2pt if benchmark in ("latency", "bw", "bibw", "multi_lat") else collectives
        builder.build(ctx, size)
        data = [c for c in be.counts if c != 4 or benchmark != "bw"]  # bw's 4-byte ack
        assert be.counts and all(type(c) is int for c in be.counts), (size, be.counts)
        if benchmark == "reduce_scatter":
            assert sum(data) * dt.itemsize == size
        else:
            assert all(c * dt.itemsize == size for c in data), (size, be.counts)


def test_reduce_scatter_split_covers_every_element():
    assert collectives.split_counts(10, 4, equal=False) == [3, 3, 2, 2]
    assert collectives.split_counts(2, 4, equal=False) == [1, 1, 0, 0]
    assert collectives.split_counts(10, 4, equal=True) == [3, 3, 3, 3]


def test_char_reduction_sums_fit_in_int8():
    dt = DTYPES["char"]
    for n in (2, 4, 64, 127):
        pat = Patterns(dt, n, reduction=True)
        total = sum(pat.data(997, s, 3).astype(np.int64) for s in range(n))
        assert total.max() <= 127
    pat = Patterns(DTYPES["float"], 4, reduction=True)
    assert not np.array_equal(pat.corrupt(pat.data(8, 1, 0)), pat.data(8, 1, 0))
    assert not np.array_equal(pat.data(8, 1, 0), pat.data(8, 1, 1))  # iteration-dependent


# --- OSU defaults and option errors ------------------------------------------------------

def test_osu_default_sizes_and_iterations():
    lat = OmbOptions(benchmark="latency")
    assert message_sizes(lat)[:3] == [0, 1, 2] and message_sizes(lat)[-1] == 4 << 20
    assert message_sizes(OmbOptions(benchmark="allgather"))[::20] == [1, 1 << 20]
    assert message_sizes(OmbOptions(benchmark="allreduce"))[0] == 4
    assert iterations_for(lat, 8192) == (10000, 100)
    assert iterations_for(lat, 16384) == (1000, 10)
    assert iterations_for(OmbOptions(benchmark="bw"), 8) == (100, 10)
    assert iterations_for(OmbOptions(benchmark="bibw"), 1 << 20) == (20, 2)
    assert iterations_for(OmbOptions(benchmark="bcast"), 8192) == (1000, 100)
    assert iterations_for(OmbOptions(benchmark="bcast"), 8193) == (100, 10)
    assert iterations_for(OmbOptions(benchmark="bcast", iterations=7, warmup=0), 1 << 20) == (7, 0)


def test_cli_parsing():
    opts = parse_args(["allreduce", "--buffer", "torch", "--compress", "zfp:rate=8",
                       "--validate", "--full", "--format", "json", "-m", "8:1024", "-i", "5",
                       "-x", "1"])
    assert (opts.benchmark, opts.buffer, opts.compress, opts.fmt) == \
        ("allreduce", "torch", "zfp:rate=8", "json")
    assert (opts.min_size, opts.max_size, opts.iterations, opts.warmup) == (8, 1024, 5, 1)
    assert opts.validate and opts.full and not opts.inject_error
    assert parse_args(["bw", "-m", "64"]).max_size == 64
    assert parse_args(["bw", "-m", "64"]).min_size is None


@pytest.mark.parametrize("argv, ranks, expected", [
    (["allreducee"], 4, ["'allreducee'", "unknown benchmark", "choose one of"]),
    (["allreduce", "-m", "4:1000"], 4, ["maximum message size 1000", "powers of two", "-m 4:512"]),
    (["allgather", "-m", "64:8"], 4, ["-m 64:8", "larger than the maximum", "-m 8:64"]),
    (["latency"], 4, ["latency with 4 ranks", "exactly two ranks", "mpiexec -n 2"]),
    (["bibw"], 3, ["exactly two ranks"]),
    (["multi_lat"], 3, ["must be even"]),
    (["allreduce", "-m", "1:2"], 4, ["smaller than one float element", "-m 1:4"]),
    (["allreduce", "--timing", "wall"], 4, ["--timing 'wall'", "osu", "loop"]),
    (["allreduce", "--thread-level", "many"], 4, ["'many'", "single, funneled"]),
    (["allreduce", "--buffer", "numpy", "--compress", "mpc"], 4, ["--buffer torch"]),
    (["alltoall", "--buffer", "torch", "--compress", "mpc"], 4, ["compressed variants"]),
    (["allreduce", "--backend", "torch"], 4, ["torch.distributed moves torch tensors"]),
    (["latency", "-m", "abc"], 2, ["-m 'abc'", "integers"]),
    (["latency", "--format", "xml"], 2, ["--format 'xml'", "table, csv, json"]),
])
def test_bad_options_name_value_rule_and_fix(argv, ranks, expected):
    with pytest.raises(OptionError) as err:
        check_options(parse_args(argv), ranks)
    for text in expected:
        assert text in str(err.value)


def test_every_violation_is_reported_at_once():
    opts = OmbOptions(benchmark="latency", min_size=3, max_size=1000, iterations=0)
    with pytest.raises(OptionError) as err:
        check_options(opts, 4)
    assert len(str(err.value).splitlines()) == 4  # min, max, iterations, world size
