"""What every op builder needs, bundled once per run so builders stay small and pure-ish."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import BufferKind
from .options import DType, OmbOptions
from .verify import Patterns


@dataclass
class Ctx:
    opts: OmbOptions
    backend: Any  # MpiBackend | TorchBackend
    kind: BufferKind
    dt: DType
    rank: int
    size: int
    patterns: Patterns
    compressor: Any = None

    def alloc(self, count: int) -> Any:
        return self.kind.alloc(count, self.dt)

    def write(self, buf: Any, values: np.ndarray) -> None:
        self.kind.write(buf, values, self.dt)

    def read(self, buf: Any) -> np.ndarray:
        return self.kind.read(buf, self.dt)

    def source(self, count: int, seed: int, it: int, injector: int) -> np.ndarray:
        """This rank's input; corrupted on rank `injector` when --inject-error is set."""
        values = self.patterns.data(count, seed, it)
        if self.opts.inject_error and self.rank == injector:
            values = self.patterns.corrupt(values)
        return values
