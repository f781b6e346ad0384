"""The timed loop, OSU style: MPI.Wtime around the whole loop, device synchronized first.

Only the benchmark's own call runs inside the plain loop. Validation and --barrier need work
between iterations (filling, checking, a barrier), so those modes time each call on its own
and leave that work outside the clock.
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


def measure(op: Op, iters: int, warmup: int, *, validate: bool, barrier: bool,
            sync: Call, comm: Any, wtime: Callable[[], float]) -> Timing:
    """Time `iters` iterations after `warmup` untimed ones; check each result if validating."""
    if not (validate or barrier):
        op.prime()
        op.run(warmup)
        sync()
        comm.Barrier()
        t0 = wtime()
        op.run(iters)
        sync()
        return Timing(wtime() - t0, True)
    call, total, ok = op.call, 0.0, True
    for it in range(warmup + iters):
        if validate:
            op.fill(it)
            sync()
        elif it == 0:
            op.prime()
        comm.Barrier()
        t0 = wtime()
        call()
        sync()
        t1 = wtime()
        if it >= warmup:
            total += t1 - t0
        if validate and not op.check(it):
            ok = False
    return Timing(total, ok)
