"""Did GPT-NeoX's train.py finish, or stop early? Its fatal paths often say `exit()`.

GPT-NeoX ends several failed starts (ZeRO 2/3 with pipelines, no optimizer, a checkpoint
without optimizer state, no autoresume library, the dataset helpers not built) with a bare
exit() or sys.exit(), whose code is 0, after printing the reason on rank 0 only. A train.py
that completes returns from pretrain(); one that raises SystemExit has stopped early. That is
a failure unless someone asked for it: neoxlab's stop request (the job script's
stop.request at the time-limit warning) or GPT-NeoX's own exit_interval.
"""

from __future__ import annotations

from pathlib import Path

TAIL_LINES = 20


class EndedEarly(Exception):  # noqa: N818 - an outcome the entry judges, then re-raises
    """train.py raised SystemExit with this code before returning from training."""

    def __init__(self, code: object) -> None:
        super().__init__(f"exit code {code!r}")
        self.code = code


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").rstrip().splitlines()
    return "\n".join(text[-lines:])


def early_exit_error(code: object, rank: int, logs: dict[str, Path], train_iters: int,
                     stop_requested: bool, exit_interval: int | None) -> str | None:
    """None when the early stop was asked for; otherwise the error, with the logs' tails.

    logs: name -> rank log; rank 0's belongs there too (GPT-NeoX prints reasons only on it)."""
    if code not in (None, 0):
        reason = f"GPT-NeoX's train.py exited with code {code}"
    elif stop_requested or exit_interval:
        return None
    else:
        reason = (f"GPT-NeoX's train.py exited (code {code!r}, counted as a failure) on rank "
                  f"{rank} before finishing its train_iters={train_iters} steps, and no stop "
                  "was requested; GPT-NeoX ends failed starts with a bare exit()")
    tails = [f"--- last lines of {name}:\n{tail}"
             for name, path in logs.items() if (tail := log_tail(path))]
    return "\n".join([reason + "; see below and the rank logs", *tails])
