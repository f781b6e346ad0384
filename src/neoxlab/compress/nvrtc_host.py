"""nvrtc_codecs.cu built for the host with g++ and loaded with ctypes: the same block codecs
the GPU runs, on CPU tensors, so the tests hold them bit for bit against zfpy and the torch
reference without a GPU. Same contracts as nvrtc_kernels.py (and triton_kernels.py).

Built once per source hash under NEOXLAB_CACHE_DIR (nvrtc.cache_dir()); needs a C++
compiler (CXX, else g++). Not a production path: the host codecs loop over blocks on one
thread.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from neoxlab.compress import nvrtc

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
FLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-x", "c++")


def build(source: Path = nvrtc.SOURCE, out_dir: Path | None = None) -> Path:
    """The shared library of source (cached by content and flags); raises with g++'s
    output when it does not compile."""
    cxx = os.environ.get("CXX", "g++")
    text = source.read_bytes()
    key = hashlib.sha256(text + repr((cxx, FLAGS)).encode()).hexdigest()[:16]
    target = (out_dir or nvrtc.cache_dir() / "host") / f"nvrtc_codecs-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
        os.close(fd)
        done = subprocess.run([cxx, *FLAGS, str(source), "-o", tmp], capture_output=True,
                              encoding="utf-8", errors="replace",
                              text=True, timeout=300, check=False)
        if done.returncode:
            os.unlink(tmp)
            raise RuntimeError(f"{cxx} could not build {source}:\n{done.stderr}")
        os.replace(tmp, target)
    return target


@cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    i64, i32, p = ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p
    lib.nx_host_zfp_encode.argtypes = [p, p, i64, i64, i32, i32]
    lib.nx_host_zfp_decode.argtypes = [p, p, i64, i64, i32, i32]
    lib.nx_host_quant_encode.argtypes = [p, p, p, i64, i32, i32, i32, i32]
    lib.nx_host_quant_decode.argtypes = [p, p, p, i64, i32, i32, i32]
    return lib


def _ptr(t: torch.Tensor) -> int:
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"the host codecs take contiguous CPU tensors, not {t.device} "
                         f"(contiguous={t.is_contiguous()})")
    return t.data_ptr()


def zfp_encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.encode (vals: n4 values, n4 % 4 == 0)."""
    rows = vals.numel() // 4
    library().nx_host_zfp_encode(_ptr(vals), _ptr(out), rows, -(-rows // 4), rate,
                                 DTYPES[vals.dtype])


def zfp_decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.decode."""
    n4 = out.numel()
    library().nx_host_zfp_decode(_ptr(payload), _ptr(out), n4, -(-n4 // 16), rate,
                                 DTYPES[out.dtype])


def quant_encode(flat: torch.Tensor, block: int, qmax: int, bits: int,
                 scales: torch.Tensor, codes: torch.Tensor) -> None:
    library().nx_host_quant_encode(_ptr(flat), _ptr(scales), _ptr(codes), flat.numel(), block,
                                   qmax, bits, DTYPES[flat.dtype])


def quant_decode(scales: torch.Tensor, codes: torch.Tensor, out: torch.Tensor, block: int,
                 bits: int) -> None:
    library().nx_host_quant_decode(_ptr(scales), _ptr(codes), _ptr(out), out.numel(), block,
                                   bits, DTYPES[out.dtype])


def quant_supported(block: int) -> bool:
    return True  # any block size
