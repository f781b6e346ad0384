"""ZFP fixed-rate compression through the real ZFP library (the ``zfpy`` package).

zfpy runs on the host only, so CUDA tensors are staged: copied to host memory, compressed
there, and the wire buffer copied back to the device (decode does the reverse); each such
call increments ``stats.staged_to_host``. fp16/bf16 input is upcast to fp32 for ZFP and
cast back on decode, so ``rate`` is bits per value for every input dtype.

Layout: the flat tensor is handed to ZFP as a 2-D array of shape (n/4, 4), i.e. ZFP's 4x4
blocks hold 16 consecutive values. Measured against plain 1-D on random, smooth and real
gradient/activation data: about 3x lower relative RMS error at the same rate (rate 8:
0.018 vs 0.055 on Gaussian data), about 1.6x faster encode and decode on one thread, and
rates 1 and 2 work (1-D ZFP blocks of 4 values cannot hold a float exponent at rate < 3;
zfpy 1.0.1 then writes past its buffer). The 0-3 values left over after the last full row
of 4 are appended raw (fp32). Body: ZFP stream (with zfpy's own header), then the tail.

Compressed size at rate R on fp32: R/32 of the input plus ZFP's 16-byte header and
64-bit stream padding (4.0x at rate 8 for large tensors).

Error: fixed-rate ZFP has no a-priori pointwise bound. Empirically (rate >= 4, on Gaussian
noise, smooth fields and real gradients/activations) the relative RMS error
||x - x'|| / ||x|| is about 4.6 * 2^-R and below ``rel_rms_bound(R) = 8 * 2^-R + 2^-22``
(smooth data is far below it); tests/unit/test_compressors.py checks that bound. At
rates 1-3 the error can exceed the signal (relative RMS > 1 on noise). fp16/bf16 output
adds its own rounding (2^-11 / 2^-8 relative). NaN/Inf -> passthrough.
"""

from __future__ import annotations

import numpy as np
import torch

from neoxlab.compress.base import (
    FLOAT_DTYPES,
    Compressor,
    Header,
    WireFormatError,
    check_int,
    finite_absmax,
    view_as,
)
from neoxlab.compress.registry import register

_ROW = 4  # values per row of the 2-D array given to ZFP


def rel_rms_bound(rate: int) -> float:
    """Empirical bound on ||x - x'|| / ||x|| for fp32 at ``rate`` >= 4 (see module doc)."""
    return 8.0 * 2.0**-rate + 2.0**-22


@register("zfp", cid=7)
class Zfp(Compressor):
    """ZFP fixed-rate mode; ``rate`` = bits per value, integer in [1, 32]."""

    requires = ("zfpy",)
    dtypes = FLOAT_DTYPES

    def __init__(self, *, rate: int = 16, **unknown: object) -> None:
        super().__init__(**unknown)
        self.rate = check_int("zfp", "rate", rate, 1, 32, "zfp:rate=8")

    @classmethod
    def param_names(cls) -> list[str]:
        return ["rate"]

    @classmethod
    def example(cls) -> str:
        return "zfp:rate=8"

    def params(self) -> dict[str, int]:
        return {"rate": self.rate}

    def _header_param(self, numel: int) -> int:
        return self.rate

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        import zfpy

        if finite_absmax(flat) is None:
            return None
        n4 = flat.numel() // _ROW * _ROW
        if n4 == 0:
            return None  # fewer than 4 values: raw is smaller than any ZFP stream
        device = flat.device
        if device.type != "cpu":
            self.stats.staged_to_host += 1
        host = flat.to("cpu", torch.float32)
        stream = zfpy.compress_numpy(host[:n4].view(-1, _ROW).numpy(), rate=self.rate)
        if len(stream) >= 4 * n4:
            return None  # no gain (small message or rate 32)
        tail = host[n4:].view(torch.uint8)
        buf = hdr.join(torch.frombuffer(bytearray(stream), dtype=torch.uint8), tail)
        return buf.to(device) if device.type != "cpu" else buf

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        import zfpy

        device = body.device
        if device.type != "cpu":
            self.stats.staged_to_host += 1
            body = body.cpu()
        n = hdr.numel
        n4 = n // _ROW * _ROW
        tail_nbytes = 4 * (n - n4)
        if body.numel() < tail_nbytes:
            raise WireFormatError(f"zfp body of {body.numel()} bytes is too short")
        out = torch.empty(n, dtype=torch.float32)
        if n4:
            stream = body[: body.numel() - tail_nbytes].numpy()
            arr = zfpy.decompress_numpy(np.ascontiguousarray(stream).tobytes())
            if arr.size != n4:
                raise WireFormatError(f"zfp stream holds {arr.size} values, expected {n4}")
            out[:n4].copy_(torch.from_numpy(arr).view(-1))
        if tail_nbytes:
            out[n4:].copy_(view_as(body[body.numel() - tail_nbytes:], torch.float32))
        return out.to(device=device, dtype=hdr.dtype)
