"""ZFP fixed-rate compression: ours in torch (any device), or the ZFP library via zfpy.

``zfp:impl=torch`` runs ZFP's fixed-rate codec with torch tensor ops (fused Triton kernels
on CUDA) on the tensor's own device (see zfp_torch.py); ``zfp:impl=zfpy`` runs the real ZFP
library on the host (CUDA tensors are staged through host memory, counted in
``stats.staged_to_host``). Both write the same bytes, so either decodes the other's. The
default ``impl=auto`` takes ours for device tensors and zfpy for host tensors: on a CPU
the library is 4-10x faster than a chain of tensor ops (bench/compressors.py), and a host
tensor has no device round trip to avoid; with NEOXLAB_CODEC_KERNELS=compile ours runs
compiled on CPU too, 1.0-2.5x the library's speed, so auto takes ours there as well.
fp16/bf16 input is upcast to fp32 for ZFP and cast back on decode, so ``rate`` is bits
per value for every input dtype.

Layout: the flat tensor is handed to ZFP as a 2-D array of shape (n/4, 4), i.e. ZFP's 4x4
blocks hold 16 consecutive values. Measured against plain 1-D on random, smooth and real
gradient/activation data: about 3x lower relative RMS error at the same rate (rate 8:
0.018 vs 0.055 on Gaussian data), about 1.6x faster encode and decode on one thread, and
rates 1 and 2 work (1-D ZFP blocks of 4 values cannot hold a float exponent at rate < 3).
When the number of rows is not a multiple of 4, ZFP pads the last block.

Payload (fixed size, ``coded_nbytes``; ``encode_fixed`` sends the raw bytes instead when
they are not larger, see base.py): the ZFP block stream - ``2 * rate`` bytes per
block of 16 values, exactly the bytes zfpy writes after its 12-byte stream header - then
the 0-3 values left over after the last full row of 4, raw in the input dtype. NaN/Inf:
a block holding one is written as ZFP's "non-zero block" bit followed by the biased
exponent 0, which ZFP itself never writes (its exponents are >= 1), and decodes as 16
NaNs; leftover values are raw, so they keep their NaN/Inf. The self-describing ``encode``
still sends such messages raw (passthrough).

Compressed size at rate R on fp32: R/32 of the input (4.0x at rate 8). A rate that
cannot shrink the dtype (R >= 16 on fp16/bf16, R = 32 on fp32) is skipped before any
encode (``encode`` sends raw; see ``shrinks``).

Error: fixed-rate ZFP has no a-priori pointwise bound. Empirically (rate >= 4, on Gaussian
noise, smooth fields and real gradients/activations) the relative RMS error
||x - x'|| / ||x|| is about 4.6 * 2^-R and below ``rel_rms_bound(R) = 8 * 2^-R + 2^-22``
(smooth data is far below it); tests/unit/test_compressors.py checks that bound. At
rates 1-3 the error can exceed the signal (relative RMS > 1 on noise). fp16/bf16 output
adds its own rounding (2^-11 / 2^-8 relative).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from neoxlab.compress import zfp_compiled, zfp_torch
from neoxlab.compress.base import (
    FLOAT_DTYPES,
    CompressionConfigError,
    Compressor,
    check_int,
    finite_absmax,
)
from neoxlab.compress.kernels import compiled_for, triton_for
from neoxlab.compress.registry import register
from neoxlab.compress.wire import Header, WireFormatError, view_as

try:  # the ZFP library: the host implementation and the reference
    import zfpy  # noqa: F401

    _HAVE_ZFPY = True
except ImportError:
    _HAVE_ZFPY = False

_ROW = 4  # values per row of the 2-D array given to ZFP
_BLOCK = 16  # values per ZFP block (4 rows of 4)
IMPLS = ("auto", "torch", "zfpy")


def rel_rms_bound(rate: int) -> float:
    """Empirical bound on ||x - x'|| / ||x|| for fp32 at ``rate`` >= 4 (see module doc)."""
    return 8.0 * 2.0**-rate + 2.0**-22


def layout(numel: int) -> tuple[int, int, int]:
    """(values in ZFP blocks n4, number of blocks, leftover values) for numel values."""
    n4 = numel // _ROW * _ROW
    return n4, -(-n4 // _BLOCK), numel - n4


def shrinks(rate: int, dtype: torch.dtype) -> bool:
    """Whether ZFP at this rate makes a dtype's values smaller (rate < bits per value)."""
    return rate < 8 * dtype.itemsize


def _torch_coders(device: torch.device) -> tuple[Callable, Callable]:
    """(encode, decode) of our ZFP for tensors on device: Triton kernels, the compiled CPU
    coders or plain torch ops (kernels.py decides; all write the same bytes)."""
    fused = triton_for(device)
    if fused:
        return fused.zfp_encode, fused.zfp_decode
    if compiled_for(device):
        return zfp_compiled.encode, zfp_compiled.decode
    return zfp_torch.encode, zfp_torch.decode


@register("zfp", cid=7)
class Zfp(Compressor):
    """ZFP fixed-rate mode; ``rate`` = bits per value, integer in [1, 32];
    ``impl`` = auto (ours on devices, zfpy on the host), torch (ours, any device) or zfpy
    (the ZFP library, host only)."""

    dtypes = FLOAT_DTYPES
    kernels = ("torch", "triton", "compile")
    # rate 8 stands for any rate without its own profile entry; rate 24 codes ~3x the bit
    # planes and runs ~2x slower, so it is timed on its own
    calibration = (("zfp", "zfp:rate=8"), ("zfp:rate=24", "zfp:rate=24"))
    tune_specs = tuple(f"zfp:rate={r}" for r in (4, 6, 8, 12, 16, 24))

    def __init__(self, *, rate: int = 16, impl: str = "auto", **unknown: object) -> None:
        super().__init__(**unknown)
        self.rate = check_int("zfp", "rate", rate, 1, 32, "zfp:rate=8")
        if impl not in IMPLS:
            raise CompressionConfigError(
                f"zfp impl={impl!r} is unknown: impl must be one of {list(IMPLS)}; use e.g. "
                "zfp:rate=8 (torch, any device) or zfp:rate=8,impl=zfpy (ZFP library, host)")
        if impl == "zfpy" and not _HAVE_ZFPY:
            raise CompressionConfigError(
                "zfp impl='zfpy' needs the Python module zfpy, which is not importable; "
                "install it (pip install zfpy) or use impl=torch")
        self.impl = impl

    def impl_for(self, device: torch.device) -> str:
        """The implementation that runs for tensors on ``device`` (resolves ``auto``)."""
        if self.impl != "auto":
            return self.impl
        host = device.type == "cpu" and not compiled_for(device)
        return "zfpy" if host and _HAVE_ZFPY else "torch"

    @classmethod
    def param_names(cls) -> list[str]:
        return ["rate", "impl"]

    @classmethod
    def example(cls) -> str:
        return "zfp:rate=8"

    def params(self) -> dict[str, int | str]:
        return {"rate": self.rate} if self.impl == "auto" else {"rate": self.rate,
                                                                 "impl": self.impl}

    def _header_param(self, numel: int) -> int:
        return self.rate

    # -- fixed-size payload --------------------------------------------------------------
    def coded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        _, nblocks, rest = layout(numel)
        return 2 * self.rate * nblocks + rest * dtype.itemsize

    def fixed_regions(self, dtype: torch.dtype) -> tuple[int, tuple[int, ...]]:
        """The payload's layout (comm/payload.py): blocks of 16 values in input order, 2 *
        rate bytes each (values past the last whole block: none when numel is a multiple)."""
        return _BLOCK, (2 * self.rate,)

    def _encode_fixed(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        n4, nblocks, rest = layout(flat.numel())
        stream_nbytes = 2 * self.rate * nblocks
        if n4:
            if self.impl_for(flat.device) == "torch":
                _torch_coders(flat.device)[0](flat[:n4], self.rate, out[:stream_nbytes])
            else:
                _zfpy_encode(self, flat[:n4], out[:stream_nbytes])
        if rest:
            out[stream_nbytes:].copy_(flat[n4:].view(torch.uint8))

    def _decode_fixed(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        n4, nblocks, rest = layout(out.numel())
        stream_nbytes = 2 * self.rate * nblocks
        if n4:
            if self.impl_for(out.device) == "torch":
                _torch_coders(out.device)[1](payload[:stream_nbytes], self.rate, out[:n4])
            else:
                _zfpy_decode(self, payload[:stream_nbytes], out[:n4])
        if rest:
            out[n4:].copy_(view_as(payload[stream_nbytes:], out.dtype))

    # -- self-describing -------------------------------------------------------------------
    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        if finite_absmax(flat) is None:
            return None
        buf, body = hdr.alloc(self.coded_nbytes(flat.numel(), flat.dtype), flat.device)
        self._encode_fixed(flat, body)
        return buf

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        if hdr.param != self.rate:
            return Zfp(rate=check_rate(hdr.param), impl=self.impl)._decode(body, hdr)
        expected = self.coded_nbytes(hdr.numel, hdr.dtype)
        if body.numel() != expected:
            raise WireFormatError(f"zfp body of {body.numel()} bytes does not match "
                                  f"{hdr.numel} values at rate {self.rate} ({expected})")
        out = torch.empty(hdr.numel, dtype=hdr.dtype, device=body.device)
        self._decode_fixed(body, out)
        return out


def check_rate(rate: int) -> int:
    if not 1 <= rate <= 32:
        raise WireFormatError(f"zfp header has rate={rate}; corrupt buffer")
    return rate


# -- zfpy (reference and host fallback) ------------------------------------------------------

def zfpy_header(n4: int, rate: int) -> bytes:
    """The 12-byte stream header zfpy writes for a float32 (n4/4, 4) array at this rate:
    magic 'zfp' + codec version 5, 52 bits of field metadata, 12 bits of mode."""
    meta = ((((n4 // _ROW - 1) << 24) | (_ROW - 1)) << 4) | (1 << 2) | 2  # 2-D, float
    mode = 16 * rate - 1
    bits = meta | mode << 52
    return b"zfp\x05" + bits.to_bytes(8, "little")


def _zfpy_encode(c: Zfp, vals: torch.Tensor, out: torch.Tensor) -> None:
    # deferred: zfpy has no wheel on every platform (ppc64le); only the host path needs it
    import zfpy

    if vals.device.type != "cpu":
        c.stats.staged_to_host += 1
    host = vals.to("cpu", torch.float32)
    bad = ~torch.isfinite(host)
    marked = bool(bad.any())
    if marked:
        host = host.masked_fill(bad, 0.0)
    stream = zfpy.compress_numpy(host.view(-1, _ROW).numpy(), rate=c.rate)
    payload = torch.frombuffer(bytearray(stream[12: 12 + out.numel()]), dtype=torch.uint8)
    if marked:
        blocks = payload.view(-1, 2 * c.rate)
        hit = _block_any(bad, blocks.shape[0])
        blocks[hit] = 0
        blocks[hit, 0] = 1  # non-zero-block bit, biased exponent 0: ZFP never writes it
    out.copy_(payload)


def _zfpy_decode(c: Zfp, payload: torch.Tensor, out: torch.Tensor) -> None:
    # deferred: zfpy has no wheel on every platform (ppc64le); only the host path needs it
    import zfpy

    if payload.device.type != "cpu":
        c.stats.staged_to_host += 1
    host = payload.cpu()
    n4 = out.numel()
    stream = zfpy_header(n4, c.rate) + bytes(host.numpy()) + bytes(-(12 + host.numel()) % 8)
    arr = zfpy.decompress_numpy(stream)
    if arr.size != n4:
        raise WireFormatError(f"zfp stream holds {arr.size} values, expected {n4}")
    vals = torch.from_numpy(np.ascontiguousarray(arr)).reshape(-1).clone()
    nan_blocks = zfp_torch.marked_blocks(host, c.rate)
    padded = torch.zeros(nan_blocks.numel() * _BLOCK, dtype=torch.bool)
    padded.view(-1, _BLOCK)[nan_blocks] = True
    vals[padded[:n4]] = float("nan")
    out.copy_(vals.to(out.device))


def _block_any(flags: torch.Tensor, nblocks: int) -> torch.Tensor:
    """Per ZFP block (16 consecutive values, the last one padded): any flag set."""
    padded = torch.zeros(nblocks * _BLOCK, dtype=torch.bool, device=flags.device)
    padded[: flags.numel()] = flags
    return padded.view(nblocks, _BLOCK).any(1)
