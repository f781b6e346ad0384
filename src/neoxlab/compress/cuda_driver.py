"""The few CUDA driver API calls the NVRTC codecs need, through ctypes (libcuda.so.1, which
every CUDA node has with its driver): load PTX into torch's context, launch on a stream.

torch runs on each device's primary context; the module is loaded into that same context
(retained here, made current before each call), so device pointers from torch tensors are
valid in the kernels, and launches go on torch's current stream, ordered with torch's own
work without any synchronisation.
"""

from __future__ import annotations

import ctypes
from functools import cache


class CudaDriverError(RuntimeError):
    pass


@cache
def _lib() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise CudaDriverError(f"the CUDA driver library libcuda.so.1 is not loadable ({err}); "
                              "the NVRTC codecs need an NVIDIA driver") from err
    _check(lib, lib.cuInit(0), "cuInit")
    return lib


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaDriverError(f"{what} failed: CUDA error {rc} "
                              f"({(msg.value or b'?').decode()})")


def available() -> bool:
    try:
        _lib()
    except CudaDriverError:
        return False
    return True


@cache
def _context(index: int) -> ctypes.c_void_p:
    lib = _lib()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    return ctx


def _make_current(index: int) -> None:
    lib = _lib()
    _check(lib, lib.cuCtxSetCurrent(_context(index)), "cuCtxSetCurrent")


class Module:
    """PTX loaded on one device; function handles by name."""

    def __init__(self, index: int, image: bytes) -> None:
        self.index = index
        lib = _lib()
        _make_current(index)
        self.handle = ctypes.c_void_p()
        rc = lib.cuModuleLoadData(ctypes.byref(self.handle), ctypes.c_char_p(image))
        if rc == 222:  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            raise CudaDriverError("the driver is older than the NVRTC that compiled the codecs "
                                  "(PTX version unsupported); use the NVRTC of the site's CUDA "
                                  "(NEOXLAB_NVRTC_LIB) or NEOXLAB_CODEC_KERNELS=torch")
        _check(lib, rc, "cuModuleLoadData")
        self._functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self._functions:
            f = ctypes.c_void_p()
            _check(_lib(), _lib().cuModuleGetFunction(ctypes.byref(f), self.handle,
                                                      name.encode()), name)
            self._functions[name] = f
        return self._functions[name]

    def launch(self, name: str, grid: int, block: int, args: list, stream: int) -> None:
        """Launch name<<<grid, block, 0, stream>>>(*args); args are ctypes values."""
        if grid <= 0:
            return
        lib = _lib()
        _make_current(self.index)
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        _check(lib, lib.cuLaunchKernel(self.function(name), ctypes.c_uint(grid), 1, 1,
                                       ctypes.c_uint(block), 1, 1, 0, ctypes.c_void_p(stream),
                                       params, None), f"cuLaunchKernel({name})")
