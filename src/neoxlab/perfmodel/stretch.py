"""How crowded the cores are while our ranks run, from the kernel's own bookkeeping.

/proc/<pid>/schedstat gives the nanoseconds a rank's main thread spent on a core (run) and
runnable but waiting for one (wait). Over a window of length T, the ranks' stretch
s = (run + wait) / run and their mean number of runnable ranks r = (run + wait) / T. With c
cores shared fairly, every runnable thread gets 1 / s of a core, so c s threads compete:
our r ranks, our ranks' helper threads (gloo's transport loops: h cores of CPU, from
/proc/<pid>/stat, worth s h always-runnable threads) and e threads of other jobs:
e = c s - r - s h. A local prediction takes e as an input, as it takes the layout: it is
measured, never fitted to step times; on an idle machine e = 0, which the model assumes
without a measurement. The helper threads are our own job's work, not other jobs', so they
stay out of e (calibration absorbs their cost into the fitted overheads). The stretch
alone also rescales calibration measurements to a core of one's own.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil


def schedstat(path: Path) -> tuple[int, int] | None:
    """(run ns, wait ns) of one task; None when it is gone or /proc has no schedstat."""
    try:
        run, wait, _ = path.read_text().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def process_cpu_ns(pid: int) -> int | None:
    """CPU time of all of a process's threads, dead ones included (utime + stime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) * TICK_NS)
    except (OSError, ValueError, IndexError):
        return None


def machine_busy_ns() -> int | None:
    """CPU time all cores spent on anything but idle and iowait since boot (/proc/stat)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return round((sum(fields[:8]) - fields[3] - fields[4]) * TICK_NS)
    except (OSError, ValueError, IndexError):
        return None


def stretch(run_ns: int, wait_ns: int) -> float | None:
    return (run_ns + wait_ns) / run_ns if run_ns > 0 else None


@dataclass(frozen=True)
class Load:
    stretch: float  # (run + wait) / run of our tasks
    runnable: float  # our tasks runnable on average (run + wait) / window
    helpers: float = 0.0  # cores used by our processes' other threads

    def others(self, cores: int) -> float:
        """cores x stretch - ours, unclamped (an average over intervals needs the sign)."""
        return cores * self.stretch - self.runnable - self.stretch * self.helpers

    def external(self, cores: int) -> float:
        """Threads of other jobs competing for the cores."""
        return max(0.0, self.others(cores))


STARTERS = {"neoxlab.forkserver.server", "neoxlab.forkserver.forked_rank"}  # forkserver/server.py


class Sampler:
    """Samples the schedstat of this process's descendants whose command line contains
    `marker` (the ranks of a run, the ranks of a micro-benchmark) every `interval` s."""

    def __init__(self, marker: str, interval: float = 0.1):
        self.marker, self.interval = marker, interval
        # pid -> (time, main thread run ns, main thread wait ns, whole process CPU ns)
        self.samples: dict[int, list[tuple[float, int, int, int]]] = defaultdict(list)
        self.machine: list[tuple[float, int]] = []  # (time, busy ns of all cores)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                cmdline = child.cmdline()
                if (any(self.marker in part for part in cmdline)
                        and not set(cmdline) & STARTERS):  # not a fork server or rank stub
                    found.append(child.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            busy = machine_busy_ns()
            if busy is not None:
                self.machine.append((now, busy))
            for pid in self._pids():
                value = schedstat(Path(f"/proc/{pid}/schedstat"))
                cpu = process_cpu_ns(pid)
                if value is not None and cpu is not None:
                    self.samples[pid].append((now, *value, cpu))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """The stretch of all sampled tasks together over [start, end]."""
        load = self.load(start, end)
        return None if load is None else load.stretch

    def load(self, start: float = 0.0, end: float = float("inf")) -> Load | None:
        """Stretch, mean runnable tasks and helper threads' cores over [start, end] (the
        samples inside it), or None without two samples of a task there."""
        run = wait = cpu = 0
        first, last = float("inf"), 0.0
        for series in self.samples.values():
            inside = [s for s in series if start <= s[0] <= end]
            if len(inside) >= 2:
                run += inside[-1][1] - inside[0][1]
                wait += inside[-1][2] - inside[0][2]
                cpu += inside[-1][3] - inside[0][3]
                first, last = min(first, inside[0][0]), max(last, inside[-1][0])
        s = stretch(run, wait)
        if s is None or last <= first:
            return None
        window = (last - first) * 1e9
        return Load(s, (run + wait) / window, max(0.0, (cpu - run) / window))


    def others_cpu(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """Cores busy with anything but the sampled tasks over [start, end]: other jobs,
        and the kernel's own work such as packet processing (a check on the estimate of
        external threads, which the model takes)."""
        inside = [m for m in self.machine if start <= m[0] <= end]
        if len(inside) < 2:
            return None
        ours = 0
        for series in self.samples.values():
            mine = [s for s in series if inside[0][0] <= s[0] <= inside[-1][0]]
            if len(mine) >= 2:
                ours += mine[-1][3] - mine[0][3]
        window = (inside[-1][0] - inside[0][0]) * 1e9
        return max(0.0, (inside[-1][1] - inside[0][1] - ours) / window)

    def external_while_running(self, cores: int, start: float = 0.0,
                               end: float = float("inf")) -> float | None:
        """Other jobs' threads our tasks met while they ran: e = c s - r - s h of each
        sampling interval, averaged with the weight of our tasks' time on a core in it.

        The ranks of a synchronous job run in bursts: all at once (compute, codecs), then all
        asleep on a link. Over a whole step the mean runnable count r is low while the
        stretch s is that of the bursts, so e of the step's totals counts our own ranks'
        contention as other jobs' threads (1.8-3.1 of them on an idle machine, for emulated
        runs at 40 Mbit/s), and a prediction then slows their CPU work by load that was
        never there. Intervals, not single samples, keep tick-rounded CPU times unbiased."""
        rounds: dict[float, dict[int, tuple[int, int, int]]] = defaultdict(dict)
        for pid, series in self.samples.items():
            for t, run, wait, cpu in series:
                if start <= t <= end:
                    rounds[t][pid] = (run, wait, cpu)
        times = sorted(rounds)
        total = weight = 0.0
        for t0, t1 in zip(times, times[1:], strict=False):
            run = wait = cpu = 0
            for pid, (r1, w1, c1) in rounds[t1].items():
                if pid in rounds[t0]:
                    r0, w0, c0 = rounds[t0][pid]
                    run, wait, cpu = run + r1 - r0, wait + w1 - w0, cpu + c1 - c0
            if run <= 0:
                continue
            window = (t1 - t0) * 1e9
            e = Load((run + wait) / run, (run + wait) / window, (cpu - run) / window).others(cores)
            total, weight = total + e * run, weight + run
        return max(0.0, total / weight) if weight else None


def steady_window(records: list[dict], warmup: int) -> tuple[float, float]:
    """(start, end) wall clock of a run's steady steps, the ones summary.json takes its median
    of (records from its metrics.jsonl: `time` is the wall clock at a step's end)."""
    steady = [r for r in records if r["step"] > warmup] or records
    return steady[0]["time"] - steady[0]["iteration_s"], steady[-1]["time"]


def during_steps(sampler: Sampler, records: list[dict], warmup: int, cores: int
                 ) -> float | None:
    """Other jobs' threads while the ranks ran their steady steps."""
    return sampler.external_while_running(cores, *steady_window(records, warmup))


@contextmanager
def this_thread() -> Iterator[list[float | None]]:
    """The calling thread's stretch over the with-block (in out[0] after it)."""
    path = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    out: list[float | None] = [None]
    before = schedstat(path)
    try:
        yield out
    finally:
        after = schedstat(path)
        if before and after:
            out[0] = stretch(after[0] - before[0], after[1] - before[1])
