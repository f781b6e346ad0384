"""neoxlab.omb times as OSU 7.4 by default: a clock around each call, a barrier after each
collective call; MPI starts at thread level single (with more ranks than cores: multiple and
MPICH's yielding wait, said in the header); -m below one element starts at it.

The timed loop runs against a stand-in communicator and clock that log every call, so the
tests see exactly what sits inside the clock and where the barriers go.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neoxlab.omb import mpistart, runner
from neoxlab.omb.mpistart import ENV, LOCAL_RANKS_ENV, YIELD_ENV, chosen_level, start_mode
from neoxlab.omb.options import OmbOptions, check_options, message_sizes, parse_args
from neoxlab.omb.osu_format import format_rows, make_row, table_header
from neoxlab.omb.timing import Op, measure
from tests.conftest import REPO_ROOT


class Log:
    """A communicator and a clock that append what happens to one list."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.now = 0.0

    def Barrier(self) -> None:  # noqa: N802 (MPI spelling)
        self.events.append("barrier")

    def wtime(self) -> float:
        self.events.append("clock")
        self.now += 1.0
        return self.now

    def op(self, n_parts: int = 1) -> Op:
        def part() -> None:
            self.events.append("call")

        parts = (part,) * n_parts

        def call() -> None:
            for p in parts:
                p()

        return Op(call=call, parts=parts)


def timed_part(events: list[str], warmup_calls: int) -> list[str]:
    """The events after the warm-up calls (each warm-up call is one 'call' event)."""
    seen = 0
    for i, e in enumerate(events):
        if e == "call":
            seen += 1
            if seen > warmup_calls:
                return events[i - 1:] if events[i - 1] == "clock" else events[i:]
    return []


def test_collectives_clock_each_call_and_barrier_after_it_by_default():
    log = Log()
    assert OmbOptions().timing == "osu"
    t = measure(log.op(), 4, 2, validate=False, barrier=False, sync=None, comm=log,
                wtime=log.wtime, pace=True)
    assert log.events[0] == "barrier"  # everyone starts together
    assert log.events[1:5] == ["call", "barrier"] * 2  # warm-up, paced the same way
    assert timed_part(log.events, 2) == ["clock", "call", "clock", "barrier"] * 4
    assert t.seconds == 4.0  # each call's own clock pair (1 s apart in the stand-in)


def test_pingpong_clocks_each_round_trip_with_no_barrier():
    log = Log()
    measure(log.op(2), 3, 1, validate=False, barrier=False, sync=None, comm=log,
            wtime=log.wtime, pace=False)
    assert log.events[:3] == ["barrier", "call", "call"]
    assert log.events[3:] == ["clock", "call", "call", "clock"] * 3


def test_loop_timing_is_one_clock_around_all_calls():
    log = Log()
    t = measure(log.op(), 5, 2, validate=False, barrier=False, sync=None, comm=log,
                wtime=log.wtime, timing="loop", pace=True)
    assert log.events.count("clock") == 2 and log.events.count("call") == 7
    assert log.events[-7:] == ["clock"] + ["call"] * 5 + ["clock"]
    assert t.seconds == 1.0


def test_validated_collective_keeps_fill_and_check_outside_the_clock():
    log = Log()
    op = log.op()
    op.fill = lambda it: log.events.append("fill")
    op.check = lambda it: log.events.append("check") is None
    measure(op, 2, 0, validate=True, barrier=False, sync=lambda: log.events.append("sync"),
            comm=log, wtime=log.wtime, pace=True)
    one = ["fill", "sync", "barrier", "clock", "call", "sync", "clock", "barrier", "check"]
    assert log.events == ["barrier"] + one * 2  # device sync counts, as OSU's would


def test_runner_paces_collectives_and_not_point_to_point(monkeypatch):
    seen = {}

    def fake_measure(op, iters, warmup, **kw):
        seen[kw["pace"]] = kw["timing"]
        raise StopIteration  # enough: we only look at how measure was asked

    monkeypatch.setattr(runner, "measure", fake_measure)
    from mpi4py import MPI

    for name, pace in (("allreduce", True), ("bcast", True), ("latency", False)):
        opts = OmbOptions(benchmark=name, min_size=4, max_size=4)
        with pytest.raises(RuntimeError):  # StopIteration inside a generator
            next(runner.iter_rows(opts, _TwoRanks(MPI.COMM_SELF)))
        assert seen.pop(pace) == "osu"


class _TwoRanks:
    """COMM_SELF that claims two ranks, so option checks pass; measure is replaced."""

    def __init__(self, comm):
        self.comm = comm

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def __getattr__(self, name):
        return getattr(self.comm, name)


def test_thread_level_is_single_unless_asked():
    assert chosen_level(None, {}) == "single"
    assert chosen_level(None, {ENV: "multiple"}) == "multiple"
    assert chosen_level("funneled", {ENV: "multiple"}) == "funneled"
    assert parse_args(["allreduce"]).thread_level is None


def started(argv: list[str], **environ: str) -> str:
    """What MPI gave a process started by start_mpi(*argv): 'single' and 'multiple' flags,
    and the yield setting it exported."""
    code = ("import os, sys; from neoxlab.omb.mpistart import start_mpi; "
            "MPI = start_mpi(sys.argv[1] if len(sys.argv) > 1 else None); "
            "print(MPI.Query_thread() == MPI.THREAD_SINGLE, "
            "MPI.Query_thread() == MPI.THREAD_MULTIPLE, "
            "os.environ.get('MPIR_CVAR_ENABLE_HEAVY_YIELD'))")
    skip = (ENV, *LOCAL_RANKS_ENV, *YIELD_ENV)
    env = {k: v for k, v in os.environ.items() if k not in skip} | environ
    env["PYTHONPATH"] = str(REPO_ROOT / "src")
    out = subprocess.run([sys.executable, "-c", code, *argv], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_mpi_starts_at_single_by_default_and_multiple_when_asked():
    assert started([]) == "True False None"
    assert started(["multiple"]) == "False True None"


def test_more_ranks_than_cores_start_at_multiple_with_a_yielding_wait():
    # more ranks on this machine (as hydra tells each rank) than any machine has cores
    assert started([], MPI_LOCALNRANKS="100000") == "False True 1"
    assert started(["single"], MPI_LOCALNRANKS="100000") == "True False None"  # as asked
    assert started([], MPI_LOCALNRANKS="1") == "True False None"


def test_the_mode_follows_ranks_against_cores():
    osu = start_mode(None, {"MPI_LOCALNRANKS": "2"}, cores=2)
    assert (osu.level, osu.env, osu.oversubscribed, osu.note()) == ("single", {}, False, None)
    assert start_mode(None, {}, cores=1).level == "single"  # no launcher count: OSU's
    over = start_mode(None, {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, cores=2)
    assert (over.level, over.env, over.oversubscribed) == ("multiple", YIELD_ENV, True)
    # a level asked for (option or mpi4py's variable) and the user's own MPICH setting win
    asked = start_mode("single", {"MPI_LOCALNRANKS": "4"}, cores=2)
    assert (asked.level, asked.env, asked.oversubscribed) == ("single", {}, True)
    assert "single as asked" in asked.note()
    assert start_mode(None, {"MPI_LOCALNRANKS": "4", ENV: "funneled"}, cores=2).level == \
        "funneled"
    mine = start_mode(None, {"MPI_LOCALNRANKS": "4", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}, 2)
    assert mine.env == {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}


def test_the_header_and_json_record_an_oversubscribed_run(monkeypatch):
    opts = OmbOptions(benchmark="allreduce")
    over = start_mode(None, {"MPI_LOCALNRANKS": "4"}, cores=2)
    head = table_header(opts, 4, "multiple", over).splitlines()
    (line,) = [ln for ln in head if ln.startswith("# Oversubscribed")]
    assert "4 ranks on 2 cores" in line and "MPIR_CVAR_ENABLE_HEAVY_YIELD=1" in line
    fits = start_mode(None, {"MPI_LOCALNRANKS": "2"}, cores=2)
    assert not any("Oversubscribed" in ln for ln in table_header(opts, 2, "single", fits)
                   .splitlines())
    monkeypatch.setattr(mpistart, "_started", over)  # as start_mpi leaves it on a rank
    rows = [make_row(opts, 4, 4, 10.0, 9.0, 11.0, 100)]
    record = json.loads(format_rows(rows, "json", opts))["start_mode"]
    assert record == {"oversubscribed": True, "local_ranks": 4, "cores": 2,
                      "thread_level": "multiple", "env": YIELD_ENV}
    assert any(ln.startswith("# Oversubscribed") for ln in
               format_rows(rows, "table", opts).splitlines())


def test_sizes_below_one_element_start_at_it_and_the_header_says_so():
    opts = parse_args(["allreduce", "-m", "1:4096"])
    check_options(opts, 2)  # accepted, as OSU accepts it
    assert message_sizes(opts) == [4 << k for k in range(11)]
    assert "# Sizes start at 4 B, one float element" in table_header(opts, 2)
    char = parse_args(["allreduce", "-m", "1:4096", "-T", "mpi_char"])  # OSU's -T spelling
    assert message_sizes(char)[0] == 1
    assert "Sizes start" not in table_header(char, 2)
