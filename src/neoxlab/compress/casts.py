"""Identity and precision casts (the PyTorch DDP fp16/bf16 compression hooks' idea).

Casts run with plain torch ops on the tensor's own device; the body is written straight
into the wire buffer, so an encode is one range check plus one converting copy.
"""

from __future__ import annotations

import torch

from neoxlab.compress.base import (
    FLOAT_DTYPES,
    Compressor,
    Header,
    finite_absmax,
    raw_bytes,
    view_as,
)
from neoxlab.compress.registry import register


@register("none", cid=1)
class Identity(Compressor):
    """No compression; keeps the header so every dimension uses the same wire path.

    Lossless for every input, NaN payloads included (the bytes are copied).
    """

    lossless = True
    gain_required = False
    dtypes = (*FLOAT_DTYPES, torch.float64)

    def __init__(self, **unknown: object) -> None:
        super().__init__(**unknown)

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor:
        return hdr.join(raw_bytes(flat))

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        return view_as(body, hdr.dtype).clone()


class _Cast(Compressor):
    """Send values in a narrower float type and cast back on decode.

    Messages with NaN/Inf, or with a magnitude beyond the target type's largest finite
    value (which the cast would turn into Inf or clamp), pass through raw and are counted.
    """

    target: torch.dtype

    def __init__(self, **unknown: object) -> None:
        super().__init__(**unknown)
        self._fmax = torch.finfo(self.target).max

    def _fixed_body_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        return numel * self.target.itemsize

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        amax = finite_absmax(flat)
        if amax is None or amax > self._fmax:
            return None
        buf, body = hdr.alloc(flat.numel() * self.target.itemsize, flat.device)
        body.view(self.target).copy_(flat)
        return buf

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        return view_as(body, self.target).to(hdr.dtype, copy=True)


@register("fp16", cid=2)
class Fp16(_Cast):
    """IEEE half: |err| <= 2^-11 |x| for |x| in [2^-14, 65504] (round to nearest), and
    |err| <= 2^-25 below (subnormals). |x| > 65504 anywhere -> the message passes through.
    Decoding to bf16 adds bf16's own rounding (2^-8 relative)."""

    target = torch.float16


@register("bf16", cid=3)
class Bf16(_Cast):
    """bfloat16: |err| <= 2^-8 |x| for normal values (8-bit mantissa, fp32's exponent
    range); values within 2^-133 of zero may flush. Only magnitudes that would round to
    Inf (> 3.3895e38) force a passthrough."""

    target = torch.bfloat16
