"""The timed loop, as OSU 7.4 times it unless told otherwise.

"osu" (default): a clock around each call, summed over the timed iterations; collectives
then wait in a barrier after every call, outside the clock (osu_allreduce and the other
blocking collectives do exactly this), so each call starts with the ranks in step.
Point-to-point benchmarks time each round trip or window with no barrier, as osu_latency
and osu_bw do. "loop": one clock around all timed calls (OSU 5 and OMB-Py).

Only the benchmark's own calls run inside the clock. The common case (no validation, no
extra barrier, host memory) runs a loop with nothing else in it; validation, --barrier and
device buffers need work between calls (filling, checking, synchronizing), so they run a
general loop that keeps that work outside the clock, except the device synchronization,
which belongs to the call's time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Call = Callable[[], Any]


def _noop() -> None:
    return None


def _true(it: int) -> bool:
    return True


def _nothing(it: int) -> None:
    return None


@dataclass
class Op:
    """One benchmark at one message size on this rank, with its buffers already bound."""

    call: Call  # one iteration
    fill: Callable[[int], None] = _nothing  # inputs for iteration `it`, outputs to a sentinel
    check: Callable[[int], bool] = _true  # is this rank's result of iteration `it` right?
    divisor: int = 1  # timed units per iteration: 2 for a ping-pong, the window for bw
    timed: bool = True  # counts in the statistics (pt2pt: only the rank that starts, as OSU)
    loop: Callable[[int], None] | None = None  # n iterations, fused; default calls `call`
    prime: Call = _noop  # data for unvalidated runs (compressors need realistic input)
    close: Call = _noop  # free persistent requests and the like
    counters: dict = field(default_factory=dict)  # compressed runs: bytes in/out of last call
    parts: tuple[Call, ...] = ()  # `call` as its bound calls, so the clock holds no wrapper

    def run(self, n: int) -> None:
        if self.loop is not None:
            self.loop(n)
            return
        call = self.call
        for _ in range(n):
            call()


@dataclass
class Timing:
    seconds: float  # this rank's timed seconds over all timed iterations
    ok: bool  # every checked result was right on this rank


def per_call(parts: tuple[Call, ...], pace: Call | None, wtime: Callable[[], float],
             warmup: int, iters: int) -> float:
    """Seconds inside the clock over `iters` calls, each call timed on its own (OSU 7.4).

    `pace` (a barrier for collectives) runs after every call, outside the clock. Warm-up
    calls run the same way, untimed. One loop per shape, so the clock brackets only the
    bound MPI calls (no wrapper frame, no branch).
    """
    if len(parts) == 1:
        (call,) = parts
        if pace is None:
            for _ in range(warmup):
                call()
            total = 0.0
            for _ in range(iters):
                t0 = wtime()
                call()
                total += wtime() - t0
            return total
        for _ in range(warmup):
            call()
            pace()
        total = 0.0
        for _ in range(iters):
            t0 = wtime()
            call()
            t1 = wtime()
            pace()
            total += t1 - t0
        return total
    if len(parts) == 2 and pace is None:  # a ping-pong: send then receive, or the reverse
        first, second = parts
        for _ in range(warmup):
            first()
            second()
        total = 0.0
        for _ in range(iters):
            t0 = wtime()
            first()
            second()
            total += wtime() - t0
        return total

    def whole() -> None:
        for part in parts:
            part()

    return per_call((whole,), pace, wtime, warmup, iters)


def measure(op: Op, iters: int, warmup: int, *, validate: bool, barrier: bool,
            sync: Call | None, comm: Any, wtime: Callable[[], float], timing: str = "osu",
            pace: bool = False) -> Timing:
    """Time `iters` iterations after `warmup` untimed ones; check each result if validating.

    timing "osu" clocks each call, "loop" the whole loop. `pace`: a barrier after every
    call (OSU's collectives). `sync` is the device synchronization, None for host memory.
    """
    after = comm.Barrier if pace else None
    if not (validate or barrier) and sync is None:
        op.prime()
        comm.Barrier()
        if timing == "osu":
            parts = op.parts or (op.call,)
            return Timing(per_call(parts, after, wtime, warmup, iters), True)
        op.run(warmup)
        comm.Barrier()
        t0 = wtime()
        op.run(iters)
        return Timing(wtime() - t0, True)
    sync = sync or _noop
    if timing == "loop" and not (validate or barrier):
        op.prime()
        op.run(warmup)
        sync()
        comm.Barrier()
        t0 = wtime()
        op.run(iters)
        sync()
        return Timing(wtime() - t0, True)
    call, total, ok = op.call, 0.0, True
    comm.Barrier()
    for it in range(warmup + iters):
        if validate:
            op.fill(it)
            sync()
        elif it == 0:
            op.prime()
        if validate or barrier:
            comm.Barrier()
        t0 = wtime()
        call()
        sync()
        t1 = wtime()
        if after is not None and timing == "osu":
            after()
        if it >= warmup:
            total += t1 - t0
        if validate and not op.check(it):
            ok = False
    return Timing(total, ok)
