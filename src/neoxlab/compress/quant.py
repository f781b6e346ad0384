"""Blockwise symmetric integer quantization (int8, int4), as in ZeRO++'s qwZ/qgZ.

Each block of ``block`` consecutive values gets one fp32 scale = max|x_block| / qmax
(qmax = 127 for int8, 7 for int4) and values q = round(x / scale). Body: the fp32 scales of
all blocks, then the codes (int8, or int4 as offset nibbles q + 8, two per byte, low nibble
first). The tail block may be shorter than ``block``.

The work is done in slices of a few hundred KiB so that fp32 temporaries stay in cache:
on one CPU thread this is several times faster than whole-tensor ops.
"""

from __future__ import annotations

import torch

from neoxlab.compress.base import (
    CompressionConfigError,
    Compressor,
    Header,
    check_int,
    view_as,
)
from neoxlab.compress.registry import register

_SLICE = 1 << 16  # values per slice of work (256 KiB of fp32)
_MAX_BLOCK = 1 << 20


class _Blockwise(Compressor):
    """Shared logic; subclasses fix qmax and the code packing."""

    qmax: int
    bits: int

    def __init__(self, *, block: int = 256, **unknown: object) -> None:
        super().__init__(**unknown)
        lo = 2 if self.bits == 4 else 1
        self.block = check_int(self.name, "block", block, lo, _MAX_BLOCK,
                               f"{self.name}:block=256")
        if self.bits == 4 and block % 2:
            raise CompressionConfigError(
                f"{self.name} block={block!r} is odd: int4 packs two codes per byte, so block "
                f"must be even; use e.g. {self.name}:block=256")

    @classmethod
    def param_names(cls) -> list[str]:
        return ["block"]

    @classmethod
    def example(cls) -> str:
        return f"{cls.name}:block=256"

    def params(self) -> dict[str, int]:
        return {"block": self.block}

    def _header_param(self, numel: int) -> int:
        return self.block

    def _code_nbytes(self, numel: int) -> int:
        return numel if self.bits == 8 else (numel + 1) // 2

    def _fixed_body_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        nblocks = -(-numel // self.block)
        return 4 * nblocks + self._code_nbytes(numel)

    # -- encode ------------------------------------------------------------------------
    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        n, blk = flat.numel(), self.block
        nblocks = -(-n // blk)
        amax = _block_absmax(flat, blk)
        if not bool(torch.isfinite(amax).all()):
            return None
        buf, body = hdr.alloc(self._fixed_body_nbytes(n, flat.dtype), flat.device)
        scales = body[: 4 * nblocks].view(torch.float32)
        torch.div(amax, self.qmax, out=scales)
        inv = torch.where(amax > 0, self.qmax / amax, torch.zeros_like(amax))
        codes = body[4 * nblocks:]
        step = max(blk, _SLICE // blk * blk)  # whole blocks per slice
        for start in range(0, n, step):
            part = flat[start: start + step].float()
            b0 = start // blk
            full = part.numel() // blk
            q = torch.empty_like(part)
            if full:
                torch.mul(part[: full * blk].view(full, blk),
                          inv[b0: b0 + full, None], out=q[: full * blk].view(full, blk))
            if part.numel() > full * blk:
                torch.mul(part[full * blk:], inv[b0 + full], out=q[full * blk:])
            q.round_()
            self._store(q, codes, start)
        return buf

    def _store(self, q: torch.Tensor, codes: torch.Tensor, start: int) -> None:
        if self.bits == 8:
            codes[start: start + q.numel()].view(torch.int8).copy_(q)
            return
        nib = (q + 8).to(torch.uint8)  # 1..15
        if nib.numel() % 2:
            nib = torch.cat([nib, nib.new_zeros(1)])
        pairs = nib.view(-1, 2)
        out = codes[start // 2: start // 2 + pairs.shape[0]]
        torch.bitwise_left_shift(pairs[:, 1], 4, out=out)
        out.bitwise_or_(pairs[:, 0])

    # -- decode ------------------------------------------------------------------------
    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        n, blk = hdr.numel, hdr.param
        if blk <= 0:
            raise CompressionConfigError(f"{self.name} header has block={blk}; corrupt buffer")
        nblocks = -(-n // blk)
        scales = view_as(body[: 4 * nblocks], torch.float32)
        codes = body[4 * nblocks:]
        out = torch.empty(n, dtype=hdr.dtype, device=body.device)
        step = max(blk, _SLICE // blk * blk)
        for start in range(0, n, step):
            m = min(step, n - start)
            q = self._load(codes, start, m)
            b0, full = start // blk, m // blk
            if full:
                q[: full * blk].view(full, blk).mul_(scales[b0: b0 + full, None])
            if m > full * blk:
                q[full * blk:].mul_(scales[b0 + full])
            out[start: start + m].copy_(q)
        return out

    def _load(self, codes: torch.Tensor, start: int, m: int) -> torch.Tensor:
        if self.bits == 8:
            return codes[start: start + m].view(torch.int8).float()
        packed = codes[start // 2: start // 2 + (m + 1) // 2]
        nib = torch.stack([packed & 15, packed >> 4], dim=1).view(-1)[:m]
        return nib.float().sub_(8)


def _block_absmax(flat: torch.Tensor, blk: int) -> torch.Tensor:
    """max|x| per block (fp32), NaN/Inf propagated; no full-size temporaries."""
    n = flat.numel()
    full = n // blk
    parts = []
    if full:
        lo, hi = torch.aminmax(flat[: full * blk].view(full, blk), dim=1)
        parts.append(torch.maximum(-lo, hi))
    if n > full * blk:
        lo, hi = torch.aminmax(flat[full * blk:])
        parts.append(torch.maximum(-lo, hi).view(1))
    amax = torch.cat(parts) if len(parts) > 1 else parts[0]
    return amax.float()


@register("int8", cid=4)
class Int8(_Blockwise):
    """int8 codes, one fp32 scale per block: ratio ~ 4 / (1 + 4/block) on fp32.

    Error bound per value: |x - x'| <= scale / 2 with scale = max|x_block| / 127, plus fp32
    rounding of the product (<= 2^-23 |x|); decoding to fp16/bf16 adds that type's
    rounding. NaN/Inf -> passthrough.
    """

    qmax = 127
    bits = 8


@register("int4", cid=5)
class Int4(_Blockwise):
    """int4 codes in [-7, 7], two per byte, one fp32 scale per block: ratio ~ 8 on fp32.

    Error bound per value: |x - x'| <= scale / 2 with scale = max|x_block| / 7 (same
    extra rounding terms as int8). ``block`` must be even. NaN/Inf -> passthrough.
    """

    qmax = 7
    bits = 4
