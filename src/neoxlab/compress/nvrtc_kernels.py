"""The NVRTC codecs on CUDA tensors: nvrtc_codecs.cu compiled once per GPU architecture
(nvrtc.py) and launched with the driver API (cuda_driver.py) on torch's current stream,
with the tensors' device pointers. Same contracts as triton_kernels.py, so zfp.py and
quant.py call either (kernels.py chooses); the same bytes as the torch reference (the host
build of the same source is tested bit for bit, nvrtc_host.py; the GPU is checked by
bench/device/device_codecs.py).

ZFP: one thread per block of 16 values. int8/int4: one warp per quantisation block (any
block size), one thread per value to decode.
"""

from __future__ import annotations

import ctypes

import torch

from neoxlab.compress import cuda_driver, nvrtc
from neoxlab.compress.nvrtc_host import DTYPES

_THREADS = 128
_MODULES: dict[int, cuda_driver.Module] = {}


def arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def module(device: torch.device) -> cuda_driver.Module:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _MODULES:
        _MODULES[index] = cuda_driver.Module(index, nvrtc.ptx(arch(device)))
    return _MODULES[index]


def _launch(name: str, device: torch.device, work: int, threads_per_item: int, args: list
            ) -> None:
    grid = -(-work * threads_per_item // _THREADS)
    stream = torch.cuda.current_stream(device).cuda_stream
    module(device).launch(name, grid, _THREADS, args, stream)


def _p(t: torch.Tensor) -> ctypes.c_void_p:
    if not t.is_contiguous():
        raise ValueError("the NVRTC codecs take contiguous tensors")
    return ctypes.c_void_p(t.data_ptr())


def _i64(v: int) -> ctypes.c_longlong:
    return ctypes.c_longlong(v)


def _i32(v: int) -> ctypes.c_int:
    return ctypes.c_int(v)


def zfp_encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.encode."""
    rows = vals.numel() // 4
    nblocks = -(-rows // 4)
    _launch("nx_zfp_encode", vals.device, nblocks, 1,
            [_p(vals), _p(out), _i64(rows), _i64(nblocks), _i32(rate), _i32(DTYPES[vals.dtype])])


def zfp_decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.decode."""
    n4 = out.numel()
    nblocks = -(-n4 // 16)
    _launch("nx_zfp_decode", out.device, nblocks, 1,
            [_p(payload), _p(out), _i64(n4), _i64(nblocks), _i32(rate), _i32(DTYPES[out.dtype])])


def quant_supported(block: int) -> bool:
    return True  # a warp loops over any block


def quant_encode(flat: torch.Tensor, block: int, qmax: int, bits: int,
                 scales: torch.Tensor, codes: torch.Tensor) -> None:
    """scales: fp32 per block; codes: int8 (uint8 storage) or packed nibbles."""
    n = flat.numel()
    _launch("nx_quant_encode", flat.device, -(-n // block), 32,
            [_p(flat), _p(scales), _p(codes), _i64(n), _i32(block), _i32(qmax), _i32(bits),
             _i32(DTYPES[flat.dtype])])


def quant_decode(scales: torch.Tensor, codes: torch.Tensor, out: torch.Tensor, block: int,
                 bits: int) -> None:
    n = out.numel()
    _launch("nx_quant_decode", out.device, n, 1,
            [_p(scales), _p(codes), _p(out), _i64(n), _i32(block), _i32(bits),
             _i32(DTYPES[out.dtype])])
