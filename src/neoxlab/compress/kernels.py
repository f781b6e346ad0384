"""Which implementation a fixed-rate codec runs: fused Triton kernels or torch ops.

NEOXLAB_CODEC_KERNELS=auto (default): Triton on CUDA tensors when Triton imports, torch
ops elsewhere; =torch: always torch ops; =triton: always Triton, on CPU tensors too, which
needs TRITON_INTERPRET=1 (Triton's interpreter; how the tests check the kernels without a
GPU); =compile: as auto, but ZFP on CPU tensors runs torch.compile'd coders
(zfp_compiled.py; minutes of compiling per process, so opt-in). All produce the same bytes.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch

CHOICES = ("auto", "torch", "triton", "compile")


def choice() -> str:
    value = os.environ.get("NEOXLAB_CODEC_KERNELS", "auto")
    if value not in CHOICES:
        raise ValueError(f"NEOXLAB_CODEC_KERNELS={value!r} is not one of {list(CHOICES)}; "
                         "unset it or use e.g. NEOXLAB_CODEC_KERNELS=torch")
    return value


def triton_for(device: torch.device) -> ModuleType | None:
    """The Triton kernel module if tensors on device should use it, else None."""
    mode = choice()
    if mode == "torch" or (mode in ("auto", "compile") and device.type != "cuda"):
        return None
    if importlib.util.find_spec("triton") is None:
        if mode == "triton":
            raise RuntimeError("NEOXLAB_CODEC_KERNELS=triton but triton is not importable; "
                               "pip install triton or use NEOXLAB_CODEC_KERNELS=torch")
        return None
    # deferred: importing Triton costs seconds; only where its kernels run
    from neoxlab.compress import triton_kernels

    return triton_kernels


def compiled_for(device: torch.device) -> bool:
    """Whether ZFP on device should run the torch.compile'd CPU coders (zfp_compiled.py)."""
    return device.type == "cpu" and choice() == "compile"
