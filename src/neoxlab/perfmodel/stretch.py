"""How crowded the cores are while our ranks run, from the kernel's own bookkeeping.

/proc/<pid>/schedstat gives the nanoseconds a task spent on a core (run) and runnable but
waiting for one (wait). Over a window of length T, our ranks' stretch s = (run + wait) / run
and their mean number of runnable ranks r = (run + wait) / T. With c cores shared fairly
among r of ours and e other threads, s = (r + e) / c, so the competing threads of other
jobs are e = c s - r. A local prediction takes e as an input, as it takes the layout: it is
measured, never fitted to step times; on an idle machine e = 0, which the model assumes
without a measurement. The stretch alone also rescales calibration measurements to a core
of one's own.
"""

from __future__ import annotations

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


def stretch(run_ns: int, wait_ns: int) -> float | None:
    return (run_ns + wait_ns) / run_ns if run_ns > 0 else None


@dataclass(frozen=True)
class Load:
    stretch: float  # (run + wait) / run of our tasks
    runnable: float  # our tasks runnable on average (run + wait) / window

    def external(self, cores: int) -> float:
        """Threads of other jobs competing for the cores: cores x stretch - ours."""
        return max(0.0, cores * self.stretch - self.runnable)


class Sampler:
    """Samples the schedstat of this process's descendants whose command line contains
    `marker` (the ranks of a run, the ranks of a micro-benchmark) every `interval` s."""

    def __init__(self, marker: str, interval: float = 0.1):
        self.marker, self.interval = marker, interval
        self.samples: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        import psutil

        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if any(self.marker in part for part in child.cmdline()):
                    found.append(child.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for pid in self._pids():
                value = schedstat(Path(f"/proc/{pid}/schedstat"))
                if value is not None:
                    self.samples[pid].append((now, *value))
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
        """Stretch and mean runnable tasks over [start, end] (the samples inside it), or
        None without two samples of a task there."""
        run = wait = 0
        first, last = float("inf"), 0.0
        for series in self.samples.values():
            inside = [s for s in series if start <= s[0] <= end]
            if len(inside) >= 2:
                run += inside[-1][1] - inside[0][1]
                wait += inside[-1][2] - inside[0][2]
                first, last = min(first, inside[0][0]), max(last, inside[-1][0])
        s = stretch(run, wait)
        if s is None or last <= first:
            return None
        return Load(s, (run + wait) / 1e9 / (last - first))


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
