"""MPC: lossless float compression after Yang, Mukka, Hesaaraki and Burtscher (2015).

Written from the paper's description with vectorized torch ops (runs on any device).
Values are handled as W-bit integer words, W = element width (16 for fp16/bf16, 32 for
fp32, 64 for fp64), so every bit pattern - NaN payloads, -0.0, Inf, subnormals -
round-trips exactly:

1. delta:     d[i] = w[i] - w[i - dim] (wrapping integer arithmetic; w[<0] = 0). Smooth
              data gives small residuals.
2. zigzag:    z = (d << 1) ^ (d >> (W-1)), so small negative residuals also have only
              leading zero bits (without it their high bit planes would be all ones and
              survive step 4).
3. bit-plane transposition over chunks of W words: word k of a chunk holds bit k of each
              of its W words (a WxW bit-matrix transpose, done in log2(W) butterfly
              stages of shifts and masks). Leading zero bits become all-zero words.
4. zero-word elimination: a bitmap with one bit per word (LSB first) marks the non-zero
              words; only those are stored.

Body: bitmap (padded to 8 bytes), then the non-zero words. The tail chunk is zero-padded.
Work is done in slices of ~256 Ki words so temporaries stay in cache. Incompressible
messages (body >= raw, e.g. random bits) pass through raw. Decode runs the steps
backwards (the transposition is its own inverse; the delta is undone by a strided
cumulative sum).
"""

from __future__ import annotations

import torch

from neoxlab.compress.base import (
    FLOAT_DTYPES,
    Compressor,
    Header,
    WireFormatError,
    check_int,
    view_as,
)
from neoxlab.compress.registry import register

_WORD = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_SLICE_WORDS = 1 << 18  # words per slice of work; a multiple of every chunk size
_BIT_WEIGHTS = 0x0102040810204080  # gathers 8 one-byte flags into the top byte


def _stages(width: int) -> list[tuple[int, int]]:
    """(j, mask) per butterfly stage: mask selects bit columns c with c & j == 0."""
    out = []
    j = width // 2
    while j:
        pattern = (1 << j) - 1
        mask = 0
        for base in range(0, width, 2 * j):
            mask |= pattern << base
        out.append((j, mask))
        j //= 2
    return out


_STAGES = {w: _stages(w) for w in (16, 32, 64)}


def transpose_bits(words: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In-place WxW bit-matrix transpose of each chunk of W consecutive W-bit words.

    After it, bit r of word k of a chunk is what was bit k of word r. Stage j swaps the
    (j x j) off-diagonal blocks: high-column bits of row r with low-column bits of row
    r + j. Arithmetic right shifts are harmless: the sign copies land in masked-off bits.
    """
    width = words.element_size() * 8
    n = words.numel()
    if scratch is None or scratch.numel() < n // 2:
        scratch = torch.empty(n // 2, dtype=words.dtype, device=words.device)
    for j, mask in _STAGES[width]:
        v = words.view(-1, 2, j)  # rows r (bit j clear) and r + j of each 2j group
        a, b = v[:, 0], v[:, 1]
        t = scratch[: n // 2].view(-1, j)
        torch.bitwise_right_shift(a, j, out=t)
        t.bitwise_xor_(b).bitwise_and_(mask)
        b.bitwise_xor_(t)
        a.bitwise_xor_(t.bitwise_left_shift_(j))
    return words


def _pack_flags(nz: torch.Tensor) -> torch.Tensor:
    """bool[8m] -> uint8[m], bit i of byte b = nz[8b + i] (one multiply per 8 flags)."""
    v = nz.view(torch.uint8).view(torch.int64) * _BIT_WEIGHTS
    return v.bitwise_right_shift_(56).to(torch.uint8)


def _unpack_flags(bits: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits.unsqueeze(1) >> shifts) & 1).view(-1).view(torch.bool)


@register("mpc", cid=8)
class Mpc(Compressor):
    """Lossless (bit-exact) MPC; ``dim`` = delta distance in elements, integer in [1, 64]."""

    lossless = True
    dtypes = (*FLOAT_DTYPES, torch.float64)

    def __init__(self, *, dim: int = 1, **unknown: object) -> None:
        super().__init__(**unknown)
        self.dim = check_int("mpc", "dim", dim, 1, 64, "mpc:dim=1")

    @classmethod
    def param_names(cls) -> list[str]:
        return ["dim"]

    @classmethod
    def example(cls) -> str:
        return "mpc:dim=1"

    def params(self) -> dict[str, int]:
        return {"dim": self.dim}

    def _header_param(self, numel: int) -> int:
        return self.dim

    # -- encode ------------------------------------------------------------------------
    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        wdt = _WORD[flat.element_size()]
        width = flat.element_size() * 8
        w = flat.view(wdt)
        n, dim = w.numel(), self.dim
        npad = -(-n // width) * width
        nbits = -(-npad // 64) * 8  # bitmap bytes, padded to 8
        raw = n * flat.element_size()
        bitmap = torch.empty(nbits, dtype=torch.uint8, device=w.device)
        words = torch.empty(n, dtype=wdt, device=w.device)  # non-zero words, compacted
        step = min(_SLICE_WORDS, npad)
        z = torch.empty(step, dtype=wdt, device=w.device)
        t = torch.empty(step, dtype=wdt, device=w.device)
        nzb = torch.empty(step, dtype=torch.bool, device=w.device)
        kept = 0
        for s in range(0, npad, step):
            m = min(step, npad - s)
            e = min(s + m, n)  # real words in this slice end here
            zs, ts, nzs = z[:m], t[:m], nzb[:m]
            _delta(w, s, e, dim, zs)
            if e - s < m:
                zs[e - s:].zero_()
            # zigzag
            torch.bitwise_right_shift(zs, width - 1, out=ts)
            zs.bitwise_left_shift_(1).bitwise_xor_(ts)
            transpose_bits(zs, ts)
            torch.ne(zs, 0, out=nzs)
            cnt = int(nzs.sum())
            if kept + cnt > n or kept * flat.element_size() + nbits >= raw:
                return None  # incompressible: the caller sends it raw
            bitmap[s // 8: (s + m) // 8].copy_(_pack_flags(nzs))
            torch.masked_select(zs, nzs, out=words[kept: kept + cnt])
            kept += cnt
        body_n = nbits + kept * flat.element_size()
        if body_n >= raw:
            return None
        if npad // 8 < nbits:
            bitmap[npad // 8:].zero_()
        return hdr.join(bitmap, words[:kept].view(torch.uint8))

    # -- decode ------------------------------------------------------------------------
    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        size = hdr.dtype.itemsize
        if size not in _WORD:
            raise WireFormatError(f"mpc cannot hold dtype {hdr.dtype}")
        wdt, width = _WORD[size], size * 8
        n, dim = hdr.numel, hdr.param
        if dim < 1:
            raise WireFormatError(f"mpc header has dim={dim}; corrupt buffer")
        npad = -(-n // width) * width
        nbits = -(-npad // 64) * 8
        if body.numel() < nbits or (body.numel() - nbits) % size:
            raise WireFormatError(f"mpc body of {body.numel()} bytes is malformed")
        bitmap = body[:nbits]
        vals = view_as(body[nbits:], wdt)
        out = torch.empty(-(-n // dim) * dim, dtype=wdt, device=body.device)
        step = min(_SLICE_WORDS, npad)
        z = torch.empty(step, dtype=wdt, device=body.device)
        t = torch.empty(step, dtype=wdt, device=body.device)
        used = 0
        for s in range(0, npad, step):
            m = min(step, npad - s)
            nzs = _unpack_flags(bitmap[s // 8: (s + m) // 8])
            cnt = int(nzs.sum())
            if used + cnt > vals.numel():
                raise WireFormatError("mpc bitmap marks more words than the body holds")
            zs = z[:m].zero_()
            zs.masked_scatter_(nzs, vals[used: used + cnt])
            used += cnt
            transpose_bits(zs, t)
            # un-zigzag: d = (z >>> 1) ^ -(z & 1)
            ts = t[:m]
            torch.bitwise_and(zs, 1, out=ts).neg_()
            zs.bitwise_right_shift_(1).bitwise_and_((1 << (width - 1)) - 1).bitwise_xor_(ts)
            e = min(s + m, n)
            out[s:e].copy_(zs[: e - s])
        if used != vals.numel():
            raise WireFormatError("mpc body holds more words than its bitmap marks")
        out[n:].zero_()
        # undo the delta: a cumulative sum over each of the dim interleaved streams
        out.view(-1, dim).cumsum_(0)
        return out[:n].view(hdr.dtype)


def _delta(w: torch.Tensor, s: int, e: int, dim: int, out: torch.Tensor) -> None:
    """out[: e - s] = w[s:e] - w[s - dim: e - dim], with w[<0] taken as 0."""
    if e <= s:
        return
    lo = max(s, dim)
    if lo > s:
        out[: min(lo, e) - s].copy_(w[s: min(lo, e)])
    if e > lo:
        torch.sub(w[lo:e], w[lo - dim: e - dim], out=out[lo - s: e - s])
