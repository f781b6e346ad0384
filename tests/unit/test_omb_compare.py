"""Pure parts behind make omb-compare and bench/omb_compressed.py: OSU table parsing,
medians, overhead verdicts and ranges, crossover and break-even bandwidth, native build
commands; bench/omb_overhead.py's forms run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neoxlab.omb import compare, native
from neoxlab.omb.options import OmbOptions
from neoxlab.omb.osu_format import format_rows, make_row, parse_table
from tests.conftest import REPO_ROOT

# the layout OSU 7's osu_latency prints with -f (hand-written, not produced by our code)
OSU_TEXT = """\
# OSU MPI Latency Test v7.4
# Datatype: MPI_CHAR.
# Size       Avg Latency(us)     Min Latency(us)     Max Latency(us)          Iterations
1                       0.21                0.20                0.35               10000
8                       0.23                0.21                0.40               10000
"""


def test_parse_table_reads_osu_layout_with_spaced_column_names():
    rows = parse_table(OSU_TEXT)
    assert rows == [
        {"Size": 1, "Avg Latency(us)": 0.21, "Min Latency(us)": 0.2,
         "Max Latency(us)": 0.35, "Iterations": 10000},
        {"Size": 8, "Avg Latency(us)": 0.23, "Min Latency(us)": 0.21,
         "Max Latency(us)": 0.4, "Iterations": 10000},
    ]


def test_parse_table_reads_our_own_tables_back():
    opts = OmbOptions(benchmark="allreduce", validate=True, compress="int8")
    rows = [make_row(opts, 4096, 2, 12.5, 12.0, 13.0, 100, ok=True, ratio=3.5)]
    got = parse_table(format_rows(rows, "table", opts))
    assert got == [{"Size": 4096, "Avg Latency(us)": 12.5, "Compression Ratio": 3.5,
                    "Eff BusBW(GB/s)": 0.33, "Validation": "Pass"}]  # 4096 B / 12.5 us
    barrier = OmbOptions(benchmark="barrier")
    text = format_rows([make_row(barrier, 0, 2, 3.0, 3.0, 3.0, 10)], "table", barrier)
    assert parse_table(text) == [{"Avg Latency(us)": 3.0}]


@pytest.mark.parametrize("text, message", [
    ("1 0.5\n", "data before any"),
    ("# Size   Avg Latency(us)\n1 0.5 7\n", "3 fields under 2 columns"),
])
def test_parse_table_rejects_malformed_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse_table(text)


def test_latencies_from_table_and_json_rows():
    assert compare.latencies(parse_table(OSU_TEXT)) == {1: 0.21, 8: 0.23}
    assert compare.latencies([{"size": 4, "avg_us": 1.5}]) == {4: 1.5}


def test_medians_keep_sizes_every_round_measured():
    rounds = [{1: 1.0, 2: 5.0, 4: 9.0}, {1: 3.0, 2: 1.0}, {1: 2.0, 2: 2.0}]
    assert compare.medians(rounds) == {1: 2.0, 2: 2.0}
    with pytest.raises(ValueError, match="no rounds"):
        compare.medians([])


def test_overhead_range_pairs_rounds_and_shows_as_a_column():
    ref = [{1: 1.0, 2: 2.0, 4: 1.0}, {1: 3.0, 2: 2.0}]
    other = [{1: 1.5, 2: 2.1}, {1: 3.1, 2: 4.0}]
    spread = compare.overhead_range(ref, other)
    assert sorted(spread) == [1, 2]  # 4 was not measured in every round
    assert spread[1] == pytest.approx((0.1, 0.5))
    assert spread[2] == pytest.approx((0.1, 2.0))
    table = compare.format_sides({"osu": {1: 2.0}, "python": {1: 2.3}}, ("osu", "python"),
                                 {1: (0.1, 0.5)})
    assert table.splitlines()[0].endswith("overhead range")
    assert table.splitlines()[1].endswith("+0.10..+0.50")
    pairs = compare.pair_up({1: 2.0}, {1: 2.3})
    assert "overhead range" not in compare.format_pairs(pairs)
    assert compare.format_pairs(pairs, spread).splitlines()[1].endswith("+0.10..+0.50")
    with pytest.raises(ValueError, match="same"):
        compare.overhead_range(ref, other[:1])


def test_overhead_ratio_and_verdicts_on_given_numbers():
    native_us = {0: 0.5, 1: 0.20, 2: 0.20, 4: 0.25, 8: 0.30, 16: 0.4}
    python_us = {0: 9.0, 1: 0.45, 2: 0.40, 4: 0.50, 8: 0.55, 16: 2.0, 32: 3.0}
    pairs = compare.pair_up(native_us, python_us)
    assert [p.size for p in pairs] == [0, 1, 2, 4, 8, 16]  # 32 has no native value
    p1 = pairs[1]
    assert p1.overhead_us == pytest.approx(0.25) and p1.ratio == pytest.approx(2.25)
    ok = compare.verdict("latency", pairs, 1, 8, 0.3)  # worst 0.25 us at 1 B and 4 B, 8 B
    assert ok.ok and ok.worst.overhead_us == pytest.approx(0.25)
    assert ok.line().startswith("latency 1-8 B: PASS, worst overhead +0.250 us")
    short = compare.verdict("latency", pairs, 1, 16, 0.3)  # 16 B: +1.6 us
    assert not short.ok and short.worst.size == 16
    assert "SHORT" in short.line() and "+1.600 us at 16 B" in short.line()
    assert compare.goal_line([ok]).startswith("goal: Python overhead <= 0.30 us over native: PASS")
    assert ": SHORT (" in compare.goal_line([ok, short])
    table = compare.format_pairs(pairs).splitlines()
    assert table[0].split() == ["#", "Size", "native", "us", "python", "us", "overhead", "us",
                                "ratio"]
    assert table[2].split() == ["1", "0.200", "0.450", "+0.250", "2.25"]


def test_verdict_and_pairing_refuse_empty_ranges():
    with pytest.raises(ValueError, match="no measured size in 4-64 B"):
        compare.verdict("allreduce", [compare.Pair(128, 1.0, 2.0)], 4, 64, 0.3)
    with pytest.raises(ValueError, match="none in common"):
        compare.pair_up({1: 1.0}, {2: 1.0})


def test_crossover_needs_every_larger_size_to_win():
    plain = {1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0}
    assert compare.crossover(plain, {1: 5.0, 2: 30.0, 4: 30.0, 8: 60.0}) == 4
    assert compare.crossover(plain, {1: 5.0, 2: 10.0, 4: 20.0, 8: 40.0}) == 1
    assert compare.crossover(plain, {1: 5.0, 2: 10.0, 4: 20.0, 8: 90.0}) is None


def test_break_even_bandwidth():
    # 2 ranks, ratio 4: saved = 1 * (1 - 1/4) = 0.75 per S/B; cost 1/E + 2/D = 1 + 2 = 3
    assert compare.break_even_GBps(2, 4.0, 1.0, 1.0) == pytest.approx(0.25)
    # 4 ranks, ratio 4: saved = 3 * (0.5 - 0.25) = 0.75; cost 1/2 + 4/4 = 1.5
    assert compare.break_even_GBps(4, 4.0, 2.0, 4.0) == pytest.approx(0.5)
    assert compare.break_even_GBps(8, 4.0, 1.0, 1.0) is None  # ratio 4 <= 8/2


def test_native_build_falls_back_to_cc_with_the_wheels_headers(tmp_path, monkeypatch):
    prefix = tmp_path / "env"
    (prefix / "include").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "include" / "mpi.h").write_text("")
    (prefix / "lib" / "libmpi.so.12").write_text("")
    monkeypatch.setattr(native, "env_prefix", lambda: prefix)
    monkeypatch.setattr(native, "c_compiler", lambda: "/usr/bin/cc")
    cmd = native.compile_command(Path("a.c"), Path("out"))
    assert cmd[0] == "/usr/bin/cc" and f"-I{prefix / 'include'}" in cmd
    assert cmd[-3:] == [f"-L{prefix / 'lib'}", f"-Wl,-rpath,{prefix / 'lib'}", "-l:libmpi.so.12"]
    (prefix / "bin").mkdir()
    (prefix / "bin" / "mpicc").write_text("")
    assert native.compile_command(Path("a.c"), Path("out"))[0] == str(prefix / "bin" / "mpicc")


def test_native_build_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "c_compiler", lambda: None)
    with pytest.raises(native.NativeBuildError, match="no C compiler"):
        native.compile_command(Path("a.c"), Path("out"))
    monkeypatch.setattr(native, "c_compiler", lambda: "/usr/bin/cc")
    monkeypatch.setattr(native, "env_prefix", lambda: tmp_path)
    with pytest.raises(native.NativeBuildError, match="pip 'mpich' wheel"):
        native.compile_command(Path("a.c"), Path("out"))
    with pytest.raises(native.NativeBuildError, match="does not exist"):
        native.build(tmp_path / "missing.c", tmp_path / "out")


def test_overhead_breakdown_runs_every_form_on_comm_self():
    """bench/omb_overhead.py: one line per call form with positive ns, request freed."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    out = subprocess.run([sys.executable, "bench/omb_overhead.py", "--calls", "50",
                          "--rounds", "2"], env=env, cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    names = [line[:42].strip() for line in rows]
    assert "Allreduce partial [MPI.buffer,1,F]" in names and "MPI.Wtime pair" in names
    assert len(names) == 13
    assert all(float(v) > 0 for line in rows for v in line[42:].split())
    assert "persistent request" not in out.stderr  # Allreduce_init's request was freed
