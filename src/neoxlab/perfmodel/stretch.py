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


def stretch(run_ns: int, wait_ns: int) -> float | None:
    return (run_ns + wait_ns) / run_ns if run_ns > 0 else None


@dataclass(frozen=True)
class Load:
    stretch: float  # (run + wait) / run of our tasks
    runnable: float  # our tasks runnable on average (run + wait) / window
    helpers: float = 0.0  # cores used by our processes' other threads

    def external(self, cores: int) -> float:
        """Threads of other jobs competing for the cores: cores x stretch - ours."""
        return max(0.0, cores * self.stretch - self.runnable - self.stretch * self.helpers)


STARTERS = {"neoxlab.run.forkserver", "neoxlab.run.forked_rank"}  # run/forkserver.py


class Sampler:
    """Samples the schedstat of this process's descendants whose command line contains
    `marker` (the ranks of a run, the ranks of a micro-benchmark) every `interval` s."""

    def __init__(self, marker: str, interval: float = 0.1):
        self.marker, self.interval = marker, interval
        # pid -> (time, main thread run ns, main thread wait ns, whole process CPU ns)
        self.samples: dict[int, list[tuple[float, int, int, int]]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        import psutil

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


def during_steps(sampler: Sampler, records: list[dict], warmup: int) -> Load | None:
    """The ranks' load over the steady steps of a run (records from its metrics.jsonl:
    `time` is the wall clock at a step's end), the steps summary.json takes its median of."""
    steady = [r for r in records if r["step"] > warmup] or records
    start = steady[0]["time"] - steady[0]["iteration_s"]
    return sampler.load(start, steady[-1]["time"])


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
