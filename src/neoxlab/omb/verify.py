"""Validation data: values that depend on rank and iteration, and the checks of every result.

Uncompressed runs use small integers so every sum is exact in every datatype and in any
reduction order; a stale or misrouted buffer shows up because values shift with the sender's
seed, the element index and the iteration, and receive buffers are reset to a sentinel that
no valid result can hold. Compressed runs use smooth floating-point data instead, so that
compressors see realistic input and report a meaningful ratio.
"""

from __future__ import annotations

import numpy as np

from .options import DType

SENTINEL = -1  # never a valid value: patterns and their sums are >= 0
SMOOTH_PERIOD = 4  # compressed data repeats every 4 iterations so tolerances can be cached


class Patterns:
    """Deterministic data for (seed, iteration): any rank can compute any other rank's input."""

    def __init__(self, dtype: DType, nranks: int, reduction: bool, smooth: bool = False):
        self.dtype, self.smooth = dtype, smooth
        if dtype.name == "char":
            # int8 sums of n contributions must stay below 128
            self.modulus = max(1, 127 // nranks) if reduction else 127
        else:
            self.modulus = 101

    def data(self, count: int, seed: int, it: int) -> np.ndarray:
        k = np.arange(count, dtype=np.int64)
        if self.smooth:
            phase = 0.7 * seed + 0.3 * (it % SMOOTH_PERIOD)
            x = 50.0 + 40.0 * np.sin(2 * np.pi * k / 97 + phase) \
                + 5.0 * np.sin(2 * np.pi * k / 13 + seed)
            return x.astype(self.dtype.numpy)
        return ((3 * k + 7 * seed + 11 * it) % self.modulus).astype(self.dtype.numpy)

    def sentinel(self, count: int) -> np.ndarray:
        return np.full(count, SENTINEL, dtype=self.dtype.numpy)

    def total(self, count: int, seeds: range | list[int], it: int,
              start: int = 0, length: int | None = None) -> np.ndarray:
        """Element-wise sum of the inputs of `seeds`, added in seed order like a local reduce."""
        length = count - start if length is None else length
        acc = self.data(count, seeds[0], it)[start:start + length].copy()
        for s in seeds[1:]:
            acc += self.data(count, s, it)[start:start + length]
        return acc

    def corrupt(self, values: np.ndarray) -> np.ndarray:
        """The testing aid behind --inject-error: one element off by more than any tolerance."""
        out = values.copy()
        if out.size:
            out[0] = out[0] + (1000 * np.abs(out).max() + 1 if self.smooth else 1)
        return out


def matches(got: np.ndarray, expected: np.ndarray, tol: np.ndarray | float | None = None) -> bool:
    """Exact equality, or |got - expected| <= tol element-wise (and finite) for lossy data."""
    if got.shape != expected.shape:
        return False
    if tol is None:
        return bool(np.array_equal(got, expected))
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    return bool(np.all(np.isfinite(got)) and np.all(diff <= tol))
