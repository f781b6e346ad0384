"""Inputs and the comparison for checking one codec implementation against another (the
Triton and NVRTC kernels against the torch reference): the unit tests and the device check
(bench/device/nvrtc_identity.py) share them, so a GPU run checks what CPU tests checked."""

from __future__ import annotations

import torch

# a float dtype's bits as the integer dtype of its width: values compared bit for bit
INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits everywhere but at NaNs, which need only be NaN in both (GPUs write
    other NaN bits)."""
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    return torch.equal(a.view(INT[a.dtype])[~nan], b.view(INT[b.dtype])[~nan])


def data(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gaussian values with a NaN, a block of tiny values and a zero block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3
    x[5] = float("nan")
    x[40:56] = torch.randn(16, generator=g) * 1e-36  # tiny block
    x[60:76] = 0.0
    return x.to(dtype)


def ties(n: int, block: int, qmax: int, dtype: torch.dtype) -> torch.Tensor:
    """Blocks whose values, once scaled by qmax / max|block|, lie exactly halfway between
    two codes (+-0.5, +-1.5, ... up to qmax - 0.5), both signs and both parities: there
    round-half-to-even and round-half-up give different codes. Each block opens with its
    max, +-qmax (scale 1) or +-qmax / 2 (scale 1/2: the ties halved)."""
    halves = torch.arange(qmax, dtype=torch.float64) + 0.5
    cycle = torch.stack([halves, -halves], 1).flatten()  # 0.5, -0.5, 1.5, -1.5, ...
    x = torch.empty(n, dtype=torch.float64)
    for b, start in enumerate(range(0, n, block)):
        size = min(block, n - start)
        shrink = 1.0 if b % 2 == 0 else 0.5
        x[start] = qmax * shrink * (1 if b % 4 < 2 else -1)
        x[start + 1: start + size] = cycle.roll(-b)[torch.arange(size - 1) % len(cycle)] * shrink
    return x.to(dtype)
