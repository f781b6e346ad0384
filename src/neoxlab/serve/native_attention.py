"""A fused decode step's attention as a small C++ kernel (decode_attention.cpp), built once
per machine with torch's extension builder (serve.native_attention).

On the CPU a decode step of many rows spends about half its time in SDPA over the KV cache
(bench/serve_profile.py: 11.3 of a 21.7 ms step at 32 rows): with one query token per (row,
head), SDPA runs a small GEMM pair per pair and reads every row up to the longest. The kernel
streams each pair's keys and values once, up to that row's own position: 1.05-1.30x a whole
decode step (bench/decode_attention.py). It is built for
this CPU (-march=native; the build's name carries a hash of the CPU's model and flags, so a
home directory shared by different CPUs keeps one build each) into torch's extension cache
(TORCH_EXTENSIONS_DIR), about 30 s the first time. When it cannot be built (no compiler,
no ninja) the step keeps SDPA, and `unavailable()` says why.
"""

from __future__ import annotations

import hashlib
import platform
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("decode_attention.cpp")
# -ffast-math: reordered (vectorised) dot products and a vectorised exp (the kernel has no
# infinities to keep); -fopenmp: torch's parallel_for is OpenMP in the CPU wheels, and
# without it the kernel would run on one thread
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
_failure: list[str] = []  # why the build failed, once it has
# kernel calls in this process: summary.json's decode_attention_calls, so that a run labelled
# "native" shows the kernel really served its decode steps
calls = 0


def _cpu_tag() -> str:
    """A short hash of what -march=native compiles for."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines()
                 if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]


@cache
def _module() -> ModuleType | None:
    # deferred: cpp_extension, only when the kernel is built
    from torch.utils import cpp_extension

    try:
        return cpp_extension.load(f"neoxlab_decode_attention_{_cpu_tag()}", [str(SOURCE)],
                                  extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                                  verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure falls back to SDPA
        _failure.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        return None


def build() -> bool:
    """Build (or load the cached build of) the kernel; False when it cannot be built."""
    return _module() is not None


def unavailable() -> str | None:
    """Why the kernel could not be built (None: it was, or has not been tried)."""
    return _failure[0] if _failure else None


def applies(q: torch.Tensor) -> bool:
    """The kernel runs fp32 host tensors; anything else keeps SDPA."""
    return q.device.type == "cpu" and q.dtype == torch.float32


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """q [n, heads, 1, d]; k, v [n, heads, keys, d]: row r attends to keys 0..positions[r].
    Returns [n, heads, 1, d], SDPA's result to fp32 rounding."""
    global calls
    module = _module()
    if module is None:
        raise RuntimeError(f"the native decode attention could not be built: {unavailable()}")
    if q.stride(-1) != 1:  # the kernel walks the head dimension contiguously
        q = q.contiguous()
    calls += 1
    return module.decode_attention(q, k, v, positions)


if __name__ == "__main__":  # make install builds it, so that no timed run or test does
    print("native decode attention: " + ("built" if build() else
                                         f"not built, decode steps keep SDPA ({unavailable()})"))
