"""neoxlab.run.progress: a bar on a terminal, one plain line per report anywhere else."""

from __future__ import annotations

import fcntl
import io
import os
import select
import struct
import termios
import time

import pytest

from neoxlab.config import ConfigError
from neoxlab.run.progress import MODE_ENV, LastFrames, Progress, mode


class Clock:
    """A clock the test moves by hand (the time-based rule without sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def no_forced_mode(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)


@pytest.fixture
def pty():
    """A real pseudo-terminal: the stream a program writes to (isatty() is true, as for a
    user's shell, 24 x 100 characters) and the descriptor its screen reads from."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    stream = os.fdopen(follower, "w")
    yield stream, leader
    stream.close()
    os.close(leader)


@pytest.fixture
def terminal(pty):
    return pty[0]


def screen_text(stream, leader: int, until: str = "END-OF-TEST") -> str:
    """What reached the terminal: `until` is written after it, and read up to it (10 s at
    most), so every earlier byte has arrived."""
    print(until, file=stream, flush=True)
    text, deadline = "", time.monotonic() + 10
    while until not in text and time.monotonic() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            text += os.read(leader, 65536).decode()
    assert until in text, text
    return text.split(until)[0]


def test_a_file_gets_one_line_per_report_and_no_frames():
    out = io.StringIO()
    progress = Progress(8, "local_3d", out, every=1)
    for step in range(1, 9):
        progress.update(1, loss=f"{10 - step:.4f}")
    progress.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 8
    for step, line in enumerate(lines, start=1):
        assert f"local_3d: step {step}/8" in line and f"loss={10 - step:.4f}" in line, line


def test_a_line_every_n_reports_or_every_s_seconds_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    progress = Progress(20, "exp", out, initial=2, every=5, every_s=60, clock=clock)
    for _ in range(8):  # steps 3..10: a line at 7 (5 after 2)
        clock.now += 1
        progress.update()
    clock.now += 61  # a slow step 11: a line, though only 4 steps since the last one
    progress.update()
    clock.now += 1
    progress.update()  # step 12: no line yet
    progress.close()  # stopped early (e.g. preempted): the last step gets its line
    shown = [line.split("step ")[1].split("/")[0] for line in out.getvalue().splitlines()]
    assert shown == ["7", "11", "12"]
    progress = Progress(20, "exp", out := io.StringIO(), every=5, clock=clock)
    for _ in range(20):
        progress.update()
    progress.close()  # the last step had its line already: nothing more
    assert [line.split("step ")[1].split(" ")[0] for line in out.getvalue().splitlines()] == [
        "5/20", "10/20", "15/20", "20/20"]


def test_a_terminal_gets_a_live_bar(pty):
    """The bar starts at 0/3, advances with each report, and its last frame shows 3/3 with
    the last report's fields."""
    terminal, leader = pty
    assert mode(terminal) == "bar"
    assert mode(io.StringIO()) == "lines" and mode(None) == "lines"
    progress = Progress(3, "exp", terminal)
    assert progress.bar is not None
    for step in range(1, 4):
        progress.update(1, loss=f"{4 - step}.0")
        assert progress.bar.n == step
    progress.close()
    frames = [f for f in screen_text(terminal, leader).replace("\n", "\r").split("\r")
              if f.strip()]
    assert frames[0].startswith("exp:   0%") and "| 0/3 " in frames[0], frames
    assert frames[-1].startswith("exp: 100%") and "| 3/3 " in frames[-1], frames
    assert "loss=1.0" in frames[-1], frames


def test_the_environment_forces_a_mode_and_a_wrong_value_is_refused(terminal, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "lines")
    assert mode(terminal) == "lines"
    monkeypatch.setenv(MODE_ENV, "fancy")
    with pytest.raises(ConfigError, match=r"NEOXLAB_PROGRESS='fancy' is not one of bar, lines"):
        mode(terminal)


def test_a_log_of_relayed_bar_frames_keeps_the_last_frame_of_each_line():
    sink = io.StringIO()
    sink.close = lambda: None  # keep the text readable after LastFrames.close
    log = LastFrames(sink)
    for chunk in ("start\n", "\rexp:  10%", "|#  | 1/10\rexp:  ", "20%|## | 2/10\r",
                  "exp: 100%|###| 10/10\n", "done\n", "\rtail 1\rtail 2"):
        log.write(chunk)
    log.close()
    assert sink.getvalue() == "start\nexp: 100%|###| 10/10\ndone\ntail 2\n"
