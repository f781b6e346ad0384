"""Buffer kinds: how to allocate, fill, read back and synchronize each kind of memory.

The benchmark code never touches a buffer's type directly, so bytearray, NumPy, torch (CPU
or CUDA), CuPy and Numba buffers run through the same timing and validation paths. Device
kinds synchronize the device before the clock is read, which OMB-Py does not do.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from .options import BUFFERS, DType


class BufferUnavailable(RuntimeError):
    """The requested buffer kind cannot be used here; the message says which and why."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"--buffer {name} is not available here: {reason}")
        self.name, self.reason = name, reason


class BufferKind:
    """Host memory exposed through the buffer protocol (bytearray, NumPy)."""

    name = "numpy"
    device = False  # device memory needs explicit synchronization before timing reads

    def alloc(self, count: int, dtype: DType) -> Any:
        # written once, as OSU's buffers: np.zeros leaves large arrays on the shared zero
        # page until first written, and untouched pages time differently
        buf = np.empty(count, dtype=dtype.numpy)
        buf.fill(0)
        return buf

    def read(self, buf: Any, dtype: DType) -> np.ndarray:
        """The buffer's elements as a NumPy array (a view for host memory, a copy for device)."""
        return np.asarray(buf).view(dtype.numpy)

    def write(self, buf: Any, values: np.ndarray, dtype: DType) -> None:
        self.read(buf, dtype)[...] = values

    def sync(self) -> None:
        """Wait for queued device work; host buffers have none."""

    def describe(self) -> str:
        return self.name


class ByteArrayKind(BufferKind):
    name = "bytearray"

    def alloc(self, count: int, dtype: DType) -> bytearray:
        return bytearray(count * dtype.itemsize)

    def read(self, buf: Any, dtype: DType) -> np.ndarray:
        return np.frombuffer(buf, dtype=dtype.numpy)


class TorchKind(BufferKind):
    """torch tensors; mpi4py takes them through DLPack (CPU) or CUDA array interface (GPU)."""

    def __init__(self, device: str):
        # deferred: torch, only for torch buffers or --compress
        import torch

        self.torch = torch
        self.dev = torch.device(device)
        self.device = self.dev.type == "cuda"
        if self.device:
            torch.cuda.set_device(self.dev)  # NCCL and CUDA-aware MPI use the current device
        self.name = "cuda" if self.device else "torch"

    def torch_dtype(self, dtype: DType):
        return getattr(self.torch, dtype.numpy)

    def alloc(self, count: int, dtype: DType):
        return self.torch.zeros(count, dtype=self.torch_dtype(dtype), device=self.dev)

    def read(self, buf: Any, dtype: DType) -> np.ndarray:
        return buf.detach().cpu().numpy() if self.device else buf.numpy()

    def write(self, buf: Any, values: np.ndarray, dtype: DType) -> None:
        buf.copy_(self.torch.from_numpy(np.ascontiguousarray(values)))

    def sync(self) -> None:
        if self.device:
            self.torch.cuda.synchronize(self.dev)

    def describe(self) -> str:
        return f"{self.name} (torch {self.torch.__version__}, {self.dev})"


class CupyKind(BufferKind):
    name = "cupy"
    device = True

    def __init__(self, cupy: Any):
        self.cp = cupy

    def alloc(self, count: int, dtype: DType):
        return self.cp.zeros(count, dtype=dtype.numpy)

    def read(self, buf: Any, dtype: DType) -> np.ndarray:
        return self.cp.asnumpy(buf)

    def write(self, buf: Any, values: np.ndarray, dtype: DType) -> None:
        buf.set(np.ascontiguousarray(values))

    def sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()


class NumbaKind(BufferKind):
    name = "numba"
    device = True

    def __init__(self, cuda: Any):
        self.cuda = cuda

    def alloc(self, count: int, dtype: DType):
        return self.cuda.to_device(np.zeros(count, dtype=dtype.numpy))

    def read(self, buf: Any, dtype: DType) -> np.ndarray:
        return buf.copy_to_host()

    def write(self, buf: Any, values: np.ndarray, dtype: DType) -> None:
        buf.copy_to_device(np.ascontiguousarray(values))

    def sync(self) -> None:
        self.cuda.synchronize()


def _import(module: str, name: str, why: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BufferUnavailable(name, f"{why} ({exc}); install it or pick another --buffer") \
            from None


def get_buffer_kind(name: str, local_rank: int = 0) -> BufferKind:
    """The buffer kind for --buffer NAME, or BufferUnavailable saying what is missing."""
    if name not in BUFFERS:
        raise BufferUnavailable(name, f"unknown buffer kind; choose one of {', '.join(BUFFERS)}")
    if name == "bytearray":
        return ByteArrayKind()
    if name == "numpy":
        return BufferKind()
    if name == "torch":
        _import("torch", name, "torch is not installed")
        return TorchKind("cpu")
    if name == "cuda":
        torch = _import("torch", name, "torch is not installed")
        if not torch.cuda.is_available():
            raise BufferUnavailable(name, f"torch {torch.__version__} sees no CUDA device "
                                    "(torch.cuda.is_available() is False)")
        return TorchKind(f"cuda:{local_rank % torch.cuda.device_count()}")
    if name == "cupy":
        cp = _import("cupy", name, "cupy is not installed")
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # cupy raises its own CUDARuntimeError without a device
            raise BufferUnavailable(name, f"cupy finds no CUDA device ({exc})") from None
        cp.cuda.Device(local_rank % max(count, 1)).use()
        return CupyKind(cp)
    numba = _import("numba.cuda", name, "numba is not installed")
    if not numba.is_available():
        raise BufferUnavailable(name, "numba.cuda.is_available() is False (no CUDA device)")
    numba.select_device(local_rank % len(numba.gpus))
    return NumbaKind(numba)
