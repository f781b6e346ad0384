"""neoxlab.omb times as OSU 7.4 by default: a clock around each call, a barrier after each
collective call; MPI starts at thread level single; -m below one element starts at it.

The timed loop runs against a stand-in communicator and clock that log every call, so the
tests see exactly what sits inside the clock and where the barriers go.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neoxlab.omb import runner
from neoxlab.omb.mpistart import ENV, chosen_level
from neoxlab.omb.options import OmbOptions, check_options, message_sizes, parse_args
from neoxlab.omb.osu_format import table_header
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


def test_mpi_starts_at_single_by_default_and_multiple_when_asked():
    code = ("import sys; from neoxlab.omb.mpistart import start_mpi; "
            "MPI = start_mpi(sys.argv[1] if len(sys.argv) > 1 else None); "
            "print(MPI.Query_thread() == MPI.THREAD_SINGLE, "
            "MPI.Query_thread() == MPI.THREAD_MULTIPLE)")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = str(REPO_ROOT / "src")
    for argv, expected in (([], "True False"), (["multiple"], "False True")):
        out = subprocess.run([sys.executable, "-c", code, *argv], env=env, cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == expected


def test_sizes_below_one_element_start_at_it_and_the_header_says_so():
    opts = parse_args(["allreduce", "-m", "1:4096"])
    check_options(opts, 2)  # accepted, as OSU accepts it
    assert message_sizes(opts) == [4 << k for k in range(11)]
    assert "# Sizes start at 4 B, one float element" in table_header(opts, 2)
    char = parse_args(["allreduce", "-m", "1:4096", "-T", "mpi_char"])  # OSU's -T spelling
    assert message_sizes(char)[0] == 1
    assert "Sizes start" not in table_header(char, 2)
