"""The repository root, the one atomic writer and the one timestamp format.

Every file a run leaves behind is written to a temporary name beside it and renamed over
it, so a crash (or a full disk) leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def now() -> str:
    """Local time with its UTC offset, the format of every timestamp neoxlab writes."""
    return time.strftime(TIME_FORMAT)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` only if the block succeeds."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None:  # a failed write() names no file: name the one we wrote
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)  # a failed write (e.g. disk full) leaves no debris


def write_atomic(path: Path, data: str | bytes) -> None:
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def rewrite_in_place(path: Path, text: str) -> bool:
    """Overwrite an existing file's own blocks with text: the fallback for a full disk, where
    the atomic writer's temporary file gets no block. Not atomic (a reader may meet it half
    written), so only for small files whose stale content is worse. False when the file is
    missing, text needs more room than the blocks it already holds, or the write fails."""
    data = text.encode()
    try:
        held = path.stat()
        if len(data) > max(held.st_size, held.st_blocks * 512):
            return False
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
    except OSError:
        return False
    return True


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding `path` (its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_full(exc: BaseException) -> str | None:
    """One line for a full disk (ENOSPC/EDQUOT): the folder and its free space; else None."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = Path(exc.filename).parent if exc.filename else Path.cwd()
    line = f"no space left on device: {where} has {gib(free_bytes(where))} free"
    if exc.filename and "status.json" in str(exc.filename):
        if getattr(exc, "status_in_place", None):
            line += f" (its status.json was rewritten in place: {exc.status_in_place})"
        else:
            line += (" and its status.json could not be written (`make status` shows the run "
                     "as unknown, not running)")
    return line + "; free space there or set launch.results_dir to a larger disk"
