"""How progress is shown, decided here only: a live tqdm bar on a terminal; elsewhere (a log
file, CI, a batch job's -o file) one plain line every N steps or S seconds, never
carriage-return frames, which a file keeps as one line of kilobytes.

Ranks write to their launcher's pipe, not to the terminal, so the local launcher decides for
them from its own stderr and passes the answer on (`child_env`); a process started without
it (a cluster job's ranks) looks at its own stream. NEOXLAB_PROGRESS=bar|lines forces one.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from neoxlab.config import ConfigError

MODE_ENV = "NEOXLAB_PROGRESS"
MODES = ("bar", "lines")
EVERY_S = 60.0  # a plain line at least this often while reports come
LINES_PER_RUN = 10  # ... and one every total/10 reports


def mode(stream: TextIO | None) -> str:
    """'bar' for a terminal, 'lines' for anything else, unless NEOXLAB_PROGRESS says."""
    forced = os.environ.get(MODE_ENV)
    if forced:
        if forced not in MODES:
            raise ConfigError(f"{MODE_ENV}={forced!r} is not one of {', '.join(MODES)}; unset "
                             "it (a bar on a terminal, plain lines elsewhere) or pick one")
        return forced
    try:
        return "bar" if stream is not None and stream.isatty() else "lines"
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return "lines"


def child_env(stream: TextIO | None = None) -> dict[str, str]:
    """The choice for processes whose output this one relays (ranks under mpiexec)."""
    return {MODE_ENV: mode(sys.stderr if stream is None else stream)}


class Progress:
    """`update(n, **postfix)` after each unit of work; `close()` at the end (also early).

    On a terminal a tqdm bar; otherwise a line `[neoxlab] <desc>: <unit> k/total (p%) key=value ...
    <elapsed> elapsed, ~<left> left` when `every` units or `every_s` seconds have passed
    since the last line, and at the last unit. A None stream shows nothing."""

    def __init__(self, total: int, desc: str, stream: TextIO | None, unit: str = "step",
                 initial: int = 0, every: int | None = None, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.stream, self.unit = total, desc, stream, unit
        self.n = self.shown = self.initial = initial
        self.every = every or max(1, math.ceil(total / LINES_PER_RUN))
        self.every_s = every_s
        self.clock = clock
        self.started = self.last = clock()
        self.postfix: dict[str, Any] = {}
        self.mode = mode(stream) if stream is not None else "off"
        self.bar = None
        if self.mode == "bar":
            self.bar = tqdm(total=total, initial=initial, file=stream, desc=desc, unit=unit,
                            dynamic_ncols=True, mininterval=0.5)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        self.postfix.update(postfix)
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)
        elif self.mode == "lines" and (self.n >= self.total or self.n - self.shown >= self.every
                                       or self.clock() - self.last >= self.every_s):
            self._line()

    def close(self) -> None:
        """The bar's last frame, or a line for the units since the last one."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.mode == "lines" and self.n != self.shown:
            self._line()

    def _line(self) -> None:
        now = self.clock()
        elapsed = now - self.started
        done = self.n - self.initial
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        fields = "".join(f" {k}={v}" for k, v in self.postfix.items())
        left = (f", ~{_duration(elapsed / done * (self.total - self.n))} left"
                if done > 0 and self.n < self.total else "")
        print(f"[neoxlab] {self.desc}: {self.unit} {self.n}/{self.total}{pct}{fields} | "
              f"{_duration(elapsed)} elapsed{left}", file=self.stream, flush=True)
        self.shown, self.last = self.n, now


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class LastFrames:
    """A log sink for relayed output: of the carriage-return frames on each line keeps only
    the last one (what a terminal ends up showing), so a bar on the terminal leaves one
    line per bar in the log, not all of its frames."""

    def __init__(self, sink: TextIO):
        self.sink = sink
        self.partial = ""

    def write(self, text: str) -> None:
        *lines, rest = (self.partial + text).split("\n")
        for line in lines:
            self.sink.write(_last_frame(line) + "\n")
        cut = rest.rstrip("\r").rfind("\r")  # keep the last frame (and a \r after it)
        self.partial = rest[cut:] if cut >= 0 else rest

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        """Write what is left of an unfinished line, then close the sink."""
        if _last_frame(self.partial):
            self.sink.write(_last_frame(self.partial) + "\n")
            self.partial = ""
        self.sink.close()


def _last_frame(line: str) -> str:
    frames = [f for f in line.split("\r") if f]
    return frames[-1] if frames else ""
