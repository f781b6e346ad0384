"""fp8 communication: e4m3 or e5m2 codes with one fp32 scale per block.

What fp8 training stacks put on the wire for gradients and parameters (Transformer Engine's
amax scaling, DeepSeek-V3's 1 x 128 tiles): each block of ``block`` consecutive values gets
scale = max|x_block| / FMAX (FMAX = 448 for e4m3, 57344 for e5m2), and each value the code
fp8(x * (FMAX / max|x_block|)) by torch's own cast to ``torch.float8_e4m3fn`` /
``torch.float8_e5m2`` (round to nearest even); decoding is float(code) * scale. The same
torch ops run on the tensor's own device (CPU or CUDA), without a host sync.

Body: the fp32 scales of all blocks, then one code byte per value (the tail block may be
shorter). Header parameter: block | format << 24. Compressed size on fp32: 8 + 32 / block
bits a value (3.9x at block 128), on fp16/bf16 1.9x.

Error per value: |x - x'| <= ulp_fp8(|x| / scale) / 2 * scale, i.e. a relative 2^-4 (e4m3,
3 mantissa bits) or 2^-3 (e5m2) for values within the format's normal range of their
block's maximum, plus fp32 rounding of the products; values below the smallest subnormal
times the scale (2^-9 x 448 / max for e4m3) flush to zero. All-zero blocks, and blocks so
tiny that FMAX / max overflows fp32, decode as zeros. NaN/Inf: the block's scale is NaN/Inf
and the whole block decodes non-finite; the self-describing ``encode`` sends such messages
raw.
"""

from __future__ import annotations

import torch

from neoxlab.compress.base import CompressionConfigError, Compressor, check_int
from neoxlab.compress.blocks import block_rows
from neoxlab.compress.registry import register
from neoxlab.compress.wire import Header, WireFormatError, dtype_view, view_as

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DEFAULT_BLOCK = 128  # values per fp32 scale (DeepSeek-V3's 1 x 128 tiles)
_MAX_BLOCK = 1 << 20
_SLICE = 1 << 18  # values per slice of work: fp32 temporaries of 1 MiB


@register("fp8", cid=9)
class Fp8(Compressor):
    """fp8 codes with a per-block fp32 scale; ``format`` = e4m3 (default, 3 mantissa
    bits, range 448) or e5m2 (2 bits, range 57344); ``block`` = values per scale."""

    cost_class = "int8"  # the same passes over the data: a block maximum, then scale and cast
    tune_specs = ("fp8", "fp8:format=e5m2")

    def __init__(self, *, format: str = "e4m3", block: int = DEFAULT_BLOCK,
                 **unknown: object) -> None:
        super().__init__(**unknown)
        if format not in FORMATS:
            raise CompressionConfigError(
                f"fp8 format={format!r} is unknown: format must be one of {list(FORMATS)}; "
                "use e.g. fp8:format=e4m3")
        self.format = format
        self.block = check_int("fp8", "block", block, 1, _MAX_BLOCK, "fp8:block=128")
        self.code = FORMATS[format]
        self.fmax = torch.finfo(self.code).max

    @classmethod
    def param_names(cls) -> list[str]:
        return ["format", "block"]

    @classmethod
    def example(cls) -> str:
        return "fp8:format=e4m3"

    def params(self) -> dict[str, str | int]:
        return {"format": self.format, "block": self.block}

    def _header_param(self, numel: int) -> int:
        return self.block | list(FORMATS).index(self.format) << 24

    def coded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        return 4 * -(-numel // self.block) + numel

    def fixed_regions(self, dtype: torch.dtype) -> tuple[int, tuple[int, ...]]:
        """The payload's layout (comm/payload.py): the blocks' fp32 scales, then the blocks'
        codes (one byte a value), each in block order."""
        return self.block, (4, self.block)

    # -- fixed-size payload --------------------------------------------------------------
    def _encode_fixed(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        """Scales then codes, slice by slice, no host sync."""
        n, blk = flat.numel(), self.block
        nblocks = -(-n // blk)
        scales = dtype_view(out[: 4 * nblocks], torch.float32)
        staged = scales is None
        if staged:
            scales = torch.empty(nblocks, dtype=torch.float32, device=flat.device)
        codes = out[4 * nblocks:].view(self.code)
        step = max(blk, _SLICE // blk * blk)  # whole blocks per slice
        for start in range(0, n, step):
            part = flat[start: start + step].float()
            b0 = start // blk
            amax = torch.cat([r.abs().amax(1) for r in block_rows(part, blk)])  # NaN/Inf propagate
            torch.div(amax, self.fmax, out=scales[b0: b0 + amax.numel()])
            # all-zero blocks, and blocks so tiny that FMAX / max overflows, code as zeros
            inv = torch.nan_to_num(self.fmax / amax, nan=0.0, posinf=0.0)
            q = torch.cat([(r * inv[lo: lo + r.shape[0], None]).reshape(-1)
                           for lo, r in _offsets(block_rows(part, blk))])
            codes[start: start + part.numel()].copy_(q.clamp_(-self.fmax, self.fmax))
        if staged:
            out[: 4 * nblocks].copy_(scales.view(torch.uint8))

    def _decode_fixed(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        _decode_blocks(payload, out, self.block, self.code)

    # -- self-describing -------------------------------------------------------------------
    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        buf, body = hdr.alloc(self.coded_nbytes(flat.numel(), flat.dtype), flat.device)
        self._encode_fixed(flat, body)
        nblocks = -(-flat.numel() // self.block)
        if not bool(torch.isfinite(view_as(body[: 4 * nblocks], torch.float32)).all()):
            return None  # NaN/Inf: the caller sends the message raw
        return buf

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        blk, fmt = hdr.param & 0xFFFFFF, hdr.param >> 24
        if blk <= 0 or fmt >= len(FORMATS):
            raise WireFormatError(f"fp8 header has block={blk}, format={fmt}; corrupt buffer")
        n = hdr.numel
        if body.numel() != 4 * -(-n // blk) + n:
            raise WireFormatError(f"fp8 body of {body.numel()} bytes does not match {n} "
                                  f"values in blocks of {blk}")
        out = torch.empty(n, dtype=hdr.dtype, device=body.device)
        _decode_blocks(body, out, blk, list(FORMATS.values())[fmt])
        return out


def _decode_blocks(body: torch.Tensor, out: torch.Tensor, blk: int, code: torch.dtype) -> None:
    """float(code) * scale into the flat out (any float dtype), slice by slice."""
    n = out.numel()
    nblocks = -(-n // blk)
    scales = view_as(body[: 4 * nblocks], torch.float32)
    codes = body[4 * nblocks: 4 * nblocks + n].view(code)
    step = max(blk, _SLICE // blk * blk)
    for start in range(0, n, step):
        q = codes[start: start + step].float()
        b0 = start // blk
        for lo, rows in _offsets(block_rows(q, blk)):
            rows.mul_(scales[b0 + lo: b0 + lo + rows.shape[0], None])
        out[start: start + q.numel()].copy_(q)


def _offsets(rows: list[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
    """(index of its first block, rows) for each of block_rows' views."""
    out, lo = [], 0
    for r in rows:
        out.append((lo, r))
        lo += r.shape[0]
    return out
