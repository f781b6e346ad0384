"""Where a small neoxlab.omb call's microseconds go: mpi4py call forms on COMM_SELF.

    python bench/omb_overhead.py [--calls 50000] [--rounds 12] [--thread-level single]

One process, no peers: MPI_Allreduce on MPI_COMM_SELF only copies 4 bytes (about 0.03 us
in C here), so what remains is the cost of reaching MPI from Python. Each form runs
--calls times per round, the forms interleaved round by round; the clock is this thread's
CPU time (time.thread_time), so time the process spends preempted by other jobs on a
shared machine does not count. Per form: the lowest and the median ns per call over the
rounds. The forms, from nothing to what neoxlab.omb's timed loop runs:
- an empty loop, a bound no-op method, a clock pair (MPI.Wtime, time.perf_counter,
  time.perf_counter_ns): what the loop and the clock cost without MPI;
- Allreduce through functools.partial on [MPI.buffer, count, MPI.FLOAT] specs (neoxlab.omb's
  form), the same spec as a tuple, on the NumPy array itself, on a bare MPI.buffer (the
  datatype read from the buffer's format), a direct call with the specs in locals;
- Iallreduce + Wait, and a persistent Allreduce_init request's Start + Wait;
- the OSU-timed shape: clock, call, clock (what lands inside neoxlab.omb's clock).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

from neoxlab.omb.mpistart import start_mpi

Run = Callable[[int], None]


def loop_of(call: Callable[[], object]) -> Run:
    def run(n: int) -> None:
        for _ in range(n):
            call()
    return run


def clock_pair(clock: Callable[[], float]) -> Run:
    def run(n: int) -> None:
        total = 0
        for _ in range(n):
            t0 = clock()
            total += clock() - t0
    return run


def forms(MPI, np) -> tuple[dict[str, Run], Callable[[], None]]:
    """{name: run(n)} and a close() for the persistent request."""
    comm = MPI.COMM_SELF
    s, r = np.ones(1, np.float32), np.zeros(1, np.float32)
    F, SUM, A = MPI.FLOAT, MPI.SUM, comm.Allreduce
    bs, br = MPI.buffer(s), MPI.buffer(r)
    spec = partial(A, [bs, 1, F], [br, 1, F], SUM)

    class Nothing:
        def method(self) -> None:
            return None

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def direct(n: int) -> None:
        a, b = [bs, 1, F], [br, 1, F]
        for _ in range(n):
            A(a, b, SUM)

    def nonblocking(n: int) -> None:
        a, b, start = [bs, 1, F], [br, 1, F], comm.Iallreduce
        for _ in range(n):
            start(a, b, SUM).Wait()

    persistent = comm.Allreduce_init([bs, 1, F], [br, 1, F], SUM)

    def restart(n: int) -> None:
        start, wait = persistent.Start, persistent.Wait
        for _ in range(n):
            start()
            wait()

    def osu_timed(n: int) -> None:
        wtime, total = MPI.Wtime, 0.0
        for _ in range(n):
            t0 = wtime()
            spec()
            total += wtime() - t0

    out = {
        "empty loop": empty,
        "bound no-op method": loop_of(Nothing().method),
        "MPI.Wtime pair": clock_pair(MPI.Wtime),
        "time.perf_counter pair": clock_pair(time.perf_counter),
        "time.perf_counter_ns pair": clock_pair(time.perf_counter_ns),
        "Allreduce partial [MPI.buffer,1,F]": loop_of(spec),
        "Allreduce partial (MPI.buffer,1,F)": loop_of(partial(A, (bs, 1, F), (br, 1, F), SUM)),
        "Allreduce partial [ndarray,1,F]": loop_of(partial(A, [s, 1, F], [r, 1, F], SUM)),
        "Allreduce partial bare MPI.buffer": loop_of(partial(A, bs, br, SUM)),
        "Allreduce direct call, specs in locals": direct,
        "Iallreduce + Wait": nonblocking,
        "Allreduce_init: Start + Wait": restart,
        "Wtime, Allreduce partial, Wtime": osu_timed,
    }
    return out, persistent.Free


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=50000, help="calls per form per round")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    ap.add_argument("--thread-level", default="single", help="MPI thread level (OSU: single)")
    args = ap.parse_args()
    if args.calls < 1 or args.rounds < 1:
        ap.error(f"--calls {args.calls} --rounds {args.rounds}: both must be at least 1")
    MPI = start_mpi(args.thread_level)
    import numpy as np

    runs, close = forms(MPI, np)
    ns: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm every path once
        run(min(args.calls, 2000))
    for _ in range(args.rounds):
        for name, run in runs.items():
            t0 = time.thread_time_ns()
            run(args.calls)
            ns[name].append((time.thread_time_ns() - t0) / args.calls)
    close()
    import mpi4py

    print(f"# mpi4py {mpi4py.__version__}, Python {sys.version.split()[0]}, "
          f"{' '.join(MPI.Get_library_version().splitlines()[0].split())}, thread level "
          f"{args.thread_level}; CPU ns per call, {args.rounds} rounds of {args.calls}")
    print(f"{'# form':<42}{'lowest':>10}{'median':>10}")
    for name, values in ns.items():
        print(f"{name:<42}{min(values):>10.1f}{statistics.median(values):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
