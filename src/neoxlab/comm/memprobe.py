"""Peak extra host memory of one call, from the kernel's resident-set high-water mark.

torch's CPU allocator keeps no statistics and tracemalloc sees only Python objects, but a
large tensor is its own mmap, resident once written: resetting VmHWM (clear_refs 5) before
the call and reading it after gives the call's peak above the resident set it started from.
Run the measured process with ALLOCATOR_ENV: glibc otherwise raises its mmap threshold as
buffers are freed (up to 32 MiB), and freed heap memory stays resident, so the high-water
mark would count the allocator's retention instead of the live tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # fixed: large buffers are their own mmap


def available() -> bool:
    return _STATUS.exists() and _CLEAR.exists()


def _field(name: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{_STATUS} has no {name} field")


def peak_extra_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """fn()'s result and the most memory it held above the resident set before it ran."""
    if not available():
        raise RuntimeError("peak_extra_bytes needs Linux /proc/self/status and clear_refs")
    base = _field("VmRSS")
    _CLEAR.write_text("5")  # resets VmHWM to the current resident set
    result = fn()
    return result, max(0, _field("VmHWM") - base)
