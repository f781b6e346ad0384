"""Identity and precision casts (the PyTorch DDP fp16/bf16 compression hooks' idea).

Casts run with plain torch ops on the tensor's own device; the body is written straight
into the wire buffer, so an encode is one range check plus one converting copy.
"""

from __future__ import annotations

import torch

from neoxlab.compress.base import FLOAT_DTYPES, Compressor, finite_absmax
from neoxlab.compress.registry import register
from neoxlab.compress.wire import Header, dtype_view, raw_bytes, view_as


@register("none", cid=1)
class Identity(Compressor):
    """No compression; keeps the header so every dimension uses the same wire path.

    Lossless for every input, NaN payloads included (the bytes are copied).
    """

    lossless = True
    gain_required = False
    dtypes = (*FLOAT_DTYPES, torch.float64)
    tune_specs = ("none",)

    def coded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        return numel * dtype.itemsize

    def fixed_regions(self, dtype: torch.dtype) -> tuple[int, tuple[int, ...]]:
        """The payload's layout (comm/payload.py): one value after another."""
        return 1, (dtype.itemsize,)

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor:
        return hdr.join(raw_bytes(flat))

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        return view_as(body, hdr.dtype).clone()


class _Cast(Compressor):
    """Send values in a narrower float type and cast back on decode.

    Messages with NaN/Inf, or with a value the cast would round to Inf (beyond the target
    type's range), pass through raw and are counted. The check runs on the cast result
    (half the bytes of the fp32 input): a non-finite result means one of those.
    """

    target: torch.dtype

    def coded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        """Fixed payload: the values in the target type. NaN/Inf stay NaN/Inf, and a value
        beyond the target's range becomes +-Inf (never finite)."""
        return numel * self.target.itemsize

    def fixed_regions(self, dtype: torch.dtype) -> tuple[int, tuple[int, ...]]:
        """The payload's layout (comm/payload.py): one cast value after another."""
        return 1, (self.target.itemsize,)

    def _encode_fixed(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        narrow = dtype_view(out, self.target)
        if narrow is None:
            out.copy_(flat.to(self.target).view(torch.uint8))
        else:
            narrow.copy_(flat)

    def _decode_fixed(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(view_as(payload, self.target))

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        buf, body = hdr.alloc(flat.numel() * self.target.itemsize, flat.device)
        self._encode_fixed(flat, body)
        return buf if finite_absmax(body.view(self.target)) is not None else None

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        out = torch.empty(hdr.numel, dtype=hdr.dtype, device=body.device)
        self._decode_fixed(body, out)
        return out


@register("fp16", cid=2)
class Fp16(_Cast):
    """IEEE half: |err| <= 2^-11 |x| for |x| in [2^-14, 65520) (round to nearest; 65504 is
    the largest half), and |err| <= 2^-25 below 2^-14 (subnormals, flush under 2^-25).
    Any |x| >= 65520 (would become Inf) -> the message passes through. Decoding to bf16
    adds bf16's own rounding (2^-8 relative)."""

    target = torch.float16
    tune_specs = ("fp16",)


@register("bf16", cid=3)
class Bf16(_Cast):
    """bfloat16: |err| <= 2^-8 |x| for |x| >= 2^-126 (8-bit significand, fp32's exponent
    range) and |err| <= 2^-134 below (subnormals). Only magnitudes that would round to Inf
    (about 3.39e38 and up) force a passthrough."""

    target = torch.bfloat16
    tune_specs = ("bf16",)
