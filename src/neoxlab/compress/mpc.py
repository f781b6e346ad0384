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
4. zero-word elimination: a bitmap with one bit per word (MSB first) marks the non-zero
              words; only those are stored.

Layout: words are processed in slices of SLICE_WORDS (2^20, part of the wire format);
inside a slice the transposed words are stored plane-major - all chunks' plane 0, then
plane 1, ... (a W x chunks matrix) - so every butterfly stage is a long contiguous
vector op instead of a short strided one (about 5x faster on one CPU thread); 2^20 words
per slice measured fastest of 2^17..2^20 (fewer op calls, temporaries still in L3).
Body: bitmap over all (padded) words in that order, padded to 8 bytes, then the non-zero
words. The tail chunk is zero-padded. Incompressible messages (body >= raw, e.g. random
bits or most gradients) pass through raw. Decode runs the steps backwards (the
transposition is its own inverse; the delta is undone by a strided cumulative sum).

Host tensors take the indices of non-zero words from NumPy (see _nonzero_1d), slice by
slice. On a device, encode compacts the whole message at once: one host sync per message
(the count of non-zero words, which sizes the output); the host path syncs per slice and
per mixed bit-plane row. A collective avoids even that one: payload_sizes counts the
non-zero words of many messages without transposing or compacting (a device tensor, read
by the collective once for its whole call), and encode_sized encodes a message whose size
the host knows without a sync. Device decode has no
host sync (word positions from a cumulative sum of the bitmap); it cannot then check that
the bitmap and the body agree, which the host path does. A message's data must be on the
device the codec runs on; NVIDIA's nvCOMP (PyPI nvidia-nvcomp-cu12) is the candidate
lossless GPU codec where CUDA is present, not integrated here (no GPU to measure it on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from neoxlab.compress.base import FLOAT_DTYPES, Compressor, check_int, checked_size
from neoxlab.compress.bitplanes import transpose_planes
from neoxlab.compress.registry import register
from neoxlab.compress.wire import Header, WireFormatError, header_nbytes, host_bytes, view_as

_WORD = {2: torch.int16, 4: torch.int32, 8: torch.int64}
SLICE_WORDS = 1 << 20  # wire format constant: a multiple of every chunk size (16, 32, 64)
COMPACT_WORDS = 1 << 18  # device compaction: int64 positions of this many words at a time
# 0x8040201008040201 as a signed int64: multiplying by it places copies of the operand
# 9 bits apart (no carries), which packs or spreads 8 flags per byte in one multiply
_SPREAD = 0x8040201008040201 - (1 << 64)
_LOW_BITS = 0x0101010101010101


@register("mpc", cid=8)
class Mpc(Compressor):
    """Lossless (bit-exact) MPC; ``dim`` = delta distance in elements, integer in [1, 64]."""

    lossless = True
    dtypes = (*FLOAT_DTYPES, torch.float64)
    calibration = (("mpc", "mpc"),)  # also its ratio on the same data (data-dependent)
    tune_specs = ("mpc",)

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
        size = flat.element_size()
        wdt, width = _WORD[size], size * 8
        w = flat.view(wdt)
        n, dim, dev = w.numel(), self.dim, w.device
        npad, nbits = _sizes(n, width)
        budget = n * size - nbits  # the non-zero words must fit in less than this
        if not _host_path(dev):
            return _encode_on_device(w, dim, hdr)
        bitmap = torch.zeros(nbits, dtype=torch.uint8, device=dev)
        words = torch.empty(n, dtype=wdt, device=dev)  # non-zero words, compacted
        step = min(SLICE_WORDS, npad)
        z, t = (torch.empty(step, dtype=wdt, device=dev) for _ in range(2))
        nzb = torch.empty(step, dtype=torch.bool, device=dev)
        kept = 0
        for s in range(0, npad, step):
            m = min(step, npad - s)
            zs, nz = z[:m], nzb[:m]
            _residual_planes(w, s, m, dim, zs, t)
            nz.copy_(zs)  # != 0; a converting copy is ~6x faster than torch.ne here
            counts = _row_counts(nz.view(width, -1))
            if (kept + sum(counts)) * size >= budget:
                return None  # incompressible: the caller sends it raw
            bitmap[s // 8: (s + m) // 8].copy_(_pack_flags(nz))
            kept = _gather_rows(zs.view(width, -1), nz.view(width, -1), counts, words, kept)
        return hdr.join(bitmap, words[:kept].view(torch.uint8))

    def payload_sizes(self, count: int, load: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """encode()'s sizes of `count` messages as an int64 tensor on their device, without
        a host sync: the count of non-zero words (kept_words) sizes a body, and a message
        that would not shrink goes raw. One message's scratch at a time."""
        sizes = []
        for i in range(count):
            x = load(i).detach()
            hlen, raw_n = header_nbytes(x.dim()), x.numel() * x.element_size()
            if x.dtype not in self.dtypes or x.numel() == 0:
                sizes.append(torch.full((), hlen + raw_n, dtype=torch.int64, device=x.device))
                continue
            words = x.contiguous().reshape(-1).view(_WORD[x.element_size()])
            size = x.element_size()
            _, nbits = _sizes(words.numel(), size * 8)
            body = kept_words(words, self.dim).mul_(size).add_(nbits)
            sizes.append(torch.where(body < raw_n, body + hlen, hlen + raw_n))
        return torch.stack(sizes)

    def encode_sized(self, x: torch.Tensor, nbytes: int) -> torch.Tensor:
        """encode(x) of a device message whose size (payload_sizes) the host knows: no
        host sync. Host messages encode as encode() does (their syncs cost nothing)."""
        x = x.detach()
        if _host_path(x.device):
            return super().encode_sized(x, nbytes)
        numel, size = x.numel(), x.element_size()
        hlen, flat = header_nbytes(x.dim()), x.contiguous().reshape(-1)
        self.stats.calls += 1
        self.stats.bytes_in += numel * size
        buf = None
        if nbytes != hlen + numel * size:  # coded (a coded body is smaller than the raw)
            planes = _device_planes(flat.view(_WORD[size]), self.dim)
            hdr = Header(self.cid, x.dtype, tuple(x.shape), param=self._header_param(numel))
            buf = _pack_planes(planes, (nbytes - hlen - planes.nbits) // size, hdr)
        if buf is None:
            buf = self._passthrough(flat, Header(self.cid, x.dtype, tuple(x.shape)))
        self.stats.bytes_out += buf.numel()
        return checked_size(self, buf, nbytes)

    # -- decode ------------------------------------------------------------------------
    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        size = hdr.dtype.itemsize
        if size not in _WORD or hdr.dtype not in self.dtypes:
            raise WireFormatError(f"mpc cannot hold dtype {hdr.dtype}")
        wdt, width = _WORD[size], size * 8
        n, dim, dev = hdr.numel, hdr.param, body.device
        if dim < 1:
            raise WireFormatError(f"mpc header has dim={dim}; corrupt buffer")
        npad, nbits = _sizes(n, width)
        if body.numel() < nbits or (body.numel() - nbits) % size:
            raise WireFormatError(f"mpc body of {body.numel()} bytes is malformed")
        bitmap = body[:nbits]
        vals = view_as(body[nbits:], wdt)
        out = torch.empty(max(npad, -(-n // dim) * dim), dtype=wdt, device=dev)
        step = min(SLICE_WORDS, npad)
        z, t = (torch.empty(step, dtype=wdt, device=dev) for _ in range(2))
        before = torch.zeros(1, dtype=torch.int64, device=dev)
        used = 0
        for s in range(0, npad, step):
            m = min(step, npad - s)
            zs = z[:m]
            if _host_path(dev):
                nz = _unpack_flags(bitmap[s // 8: (s + m) // 8]).view(width, -1)
                counts = _row_counts(nz)
                if used + sum(counts) > vals.numel():
                    raise WireFormatError("mpc bitmap marks more words than the body holds")
                used = _scatter_rows(zs.view(width, -1), nz, counts, vals, used)
            else:
                before = _scatter_slice(bitmap, vals, s, zs, before)
            transpose_planes(zs.view(width, m // width), t)
            # un-zigzag: d = (z >>> 1) ^ -(z & 1)
            ts = t[:m]
            torch.bitwise_and(zs, 1, out=ts).neg_()
            zs.bitwise_right_shift_(1).bitwise_and_((1 << (width - 1)) - 1).bitwise_xor_(ts)
            out[s: s + m].view(m // width, width).copy_(zs.view(width, m // width).t())
        if _host_path(dev) and used != vals.numel():
            raise WireFormatError("mpc body holds more words than its bitmap marks")
        # undo the delta: a cumulative sum over each of the dim interleaved streams
        m = -(-n // dim) * dim
        out[n:m].zero_()
        out[:m].view(-1, dim).cumsum_(0)
        return out[:n].view(hdr.dtype)


def _pack_flags(nz: torch.Tensor) -> torch.Tensor:
    """bool[8m] -> uint8[m], MSB first: bit 7 - i of byte b = nz[8b + i]."""
    v = nz.view(torch.uint8).view(torch.int64) * _SPREAD
    return v.bitwise_right_shift_(56).to(torch.uint8)


def _unpack_flags(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of _pack_flags: uint8[m] -> bool[8m]."""
    v = bits.to(torch.int64).mul_(_SPREAD).bitwise_right_shift_(7).bitwise_and_(_LOW_BITS)
    return v.view(torch.uint8).view(torch.bool)


def _sizes(n: int, width: int) -> tuple[int, int]:
    """(padded word count, bitmap bytes padded to 8)."""
    npad = -(-n // width) * width
    return npad, -(-npad // 64) * 8


# Host tensors compact row by row with NumPy (fastest on CPU, one sync per slice costs
# nothing there); devices use the whole-message path below. Tests flip this to run the
# device path on CPU.
FORCE_DEVICE_PATH = False


def _host_path(dev: torch.device) -> bool:
    return dev.type == "cpu" and not FORCE_DEVICE_PATH


def _residual_planes(w: torch.Tensor, s: int, m: int, dim: int, zs: torch.Tensor,
                     t: torch.Tensor) -> None:
    """zs <- zigzagged delta residuals of words [s, s+m), bit-plane transposed."""
    width = w.element_size() * 8
    zm = zs.view(width, m // width)
    _delta_planes(w, s, m, dim, zm, t)
    torch.bitwise_right_shift(zs, width - 1, out=t[:m])  # zigzag
    zs.bitwise_left_shift_(1).bitwise_xor_(t[:m])
    transpose_planes(zm, t)


@dataclass
class _Planes:
    """One message's transposed residual words on the device, their non-zero flags (packed,
    the wire's bitmap) and how many are non-zero (a device scalar: reading it is the host
    sync a variable size costs)."""

    zall: torch.Tensor
    bitmap: torch.Tensor
    kept: torch.Tensor
    npad: int
    nbits: int
    budget: int


def _slices(npad: int) -> list[tuple[int, int]]:
    step = min(SLICE_WORDS, npad)
    return [(s, min(step, npad - s)) for s in range(0, npad, step)]


def _device_planes(w: torch.Tensor, dim: int) -> _Planes:
    """The residual planes of a whole message and its bitmap, slice by slice, without a
    host sync; scratch beside the words: one slice of flags and counts."""
    dev, size = w.device, w.element_size()
    width = size * 8
    npad, nbits = _sizes(w.numel(), width)
    zall = torch.empty(npad, dtype=w.dtype, device=dev)
    t = torch.empty(min(SLICE_WORDS, npad), dtype=w.dtype, device=dev)
    bitmap = torch.zeros(nbits, dtype=torch.uint8, device=dev)  # its padding stays zero
    kept = torch.zeros((), dtype=torch.int64, device=dev)
    for s, m in _slices(npad):
        zs = zall[s: s + m]
        _residual_planes(w, s, m, dim, zs, t)
        nz = zs != 0
        bitmap[s // 8: (s + m) // 8].copy_(_pack_flags(nz))
        kept += nz.sum()
    return _Planes(zall, bitmap, kept, npad, nbits, w.numel() * size - nbits)


def _pack_planes(p: _Planes, kept: int, hdr: Header) -> torch.Tensor | None:
    """The wire buffer of staged planes with `kept` non-zero words (None: incompressible,
    the caller sends it raw). The words are scattered straight into the buffer, whose
    storage has one spare word past its end for the zero words to land on; positions are
    computed COMPACT_WORDS at a time, not as int64 arrays of the whole message."""
    size = p.zall.element_size()
    if kept * size >= p.budget:
        return None
    dev = p.zall.device
    head = hdr.pack(p.nbits + kept * size)
    start = len(head) + p.nbits  # 8-aligned: headers and bitmaps are multiples of 8 bytes
    full = torch.empty(start + (kept + 1) * size, dtype=torch.uint8, device=dev)
    full[: len(head)].copy_(host_bytes(head, dev), non_blocking=True)
    full[len(head): start].copy_(p.bitmap)
    words = full[start:].view(p.zall.dtype)  # kept words, then the spare one
    before = torch.zeros(1, dtype=torch.int64, device=dev)  # non-zero words so far
    for s in range(0, p.npad, COMPACT_WORDS):
        zs = p.zall[s: s + COMPACT_WORDS]
        nz = zs != 0
        pos = torch.cumsum(nz, 0).add_(before - 1)
        before = pos[-1:] + 1
        words.scatter_(0, pos.masked_fill_(~nz, kept), zs)
    return full[: start + kept * size]


def _encode_on_device(w: torch.Tensor, dim: int, hdr: Header) -> torch.Tensor | None:
    """Whole-message compaction: one host sync per message (the count of non-zero words,
    which sizes the output), instead of one per slice and one per mixed bit-plane row;
    Mpc.encode_sized, given the size, makes none."""
    planes = _device_planes(w, dim)
    return _pack_planes(planes, int(planes.kept), hdr)  # the one host sync: the size


def _scatter_slice(bitmap: torch.Tensor, vals: torch.Tensor, s: int, zs: torch.Tensor,
                   before: torch.Tensor) -> torch.Tensor:
    """Transposed words [s, s + len(zs)) of a message from its bitmap and non-zero words,
    into zs, without a host sync: word i is vals[(set flags before i)] where its flag is
    set. `before`: the set flags before this slice (device); returns those after it."""
    nz = _unpack_flags(bitmap[s // 8: (s + zs.numel()) // 8])
    if vals.numel() == 0:
        zs.zero_()
        return before
    pos = torch.cumsum(nz, 0).add_(before - 1)
    after = pos[-1:] + 1
    torch.index_select(vals, 0, pos.clamp_(0, vals.numel() - 1), out=zs)
    zs.masked_fill_(~nz, 0)
    return after


def _row_counts(nz: torch.Tensor) -> list[int]:
    """Set flags per row of a contiguous 2-D bool tensor.

    Each int64 holds 8 one-byte flags; multiplying by 0x0101010101010101 sums them into the
    top byte. (count_nonzero(dim=1) is ~30x slower; a dtype=int32 sum first converts.)"""
    if nz.shape[1] % 8:  # only in a message's last, partial slice
        return nz.view(torch.uint8).sum(1, dtype=torch.int32).tolist()
    v = nz.view(torch.uint8).view(torch.int64) * _LOW_BITS
    return v.bitwise_right_shift_(56).sum(1).tolist()


def _nonzero_1d(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the set flags of a 1-D bool tensor. On CPU torch.nonzero is ~8x slower
    than NumPy's flatnonzero (1.1 ms vs 0.1 ms per 256 Ki flags), and it was the largest
    cost of encoding smooth data, so host tensors use NumPy; devices use torch."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().squeeze(1)


def _gather_rows(zm: torch.Tensor, nz: torch.Tensor, counts: list[int], words: torch.Tensor,
                 kept: int) -> int:
    """Append the non-zero words of zm (row by row) to words[kept:]; return the new end.

    Rows are bit planes, which are often entirely zero or entirely non-zero: those cost
    nothing or one contiguous copy, and only mixed rows need an index gather."""
    nch = zm.shape[1]
    for r, c in enumerate(counts):
        if c == nch:
            words[kept: kept + c].copy_(zm[r])
        elif c:
            torch.index_select(zm[r], 0, _nonzero_1d(nz[r]), out=words[kept: kept + c])
        kept += c
    return kept


def _scatter_rows(zm: torch.Tensor, nz: torch.Tensor, counts: list[int], vals: torch.Tensor,
                  used: int) -> int:
    """Inverse of _gather_rows: fill zm from vals[used:] where nz is set, zeros elsewhere."""
    nch = zm.shape[1]
    for r, c in enumerate(counts):
        if c == nch:
            zm[r].copy_(vals[used: used + c])
        else:
            zm[r].zero_()
            if c:
                zm[r].index_copy_(0, _nonzero_1d(nz[r]), vals[used: used + c])
        used += c
    return used


def _delta_planes(w: torch.Tensor, s: int, m: int, dim: int, zm: torch.Tensor,
                  tmp: torch.Tensor) -> None:
    """zm (W x m/W, plane-major) <- residuals d[i] = w[i] - w[i - dim] for i in [s, s+m),
    w[<0] = 0 and d = 0 past the end. A contiguous subtraction then one transposing copy
    (2.5x faster than a subtraction that reads strided)."""
    width, nch = zm.shape
    d = tmp[:m]
    _delta_words(w, s, m, dim, d)
    zm.copy_(d.view(nch, width).t())


def _delta_words(w: torch.Tensor, s: int, m: int, dim: int, d: torch.Tensor) -> None:
    """d (m words, in word order) <- d[i] = w[i] - w[i - dim] for i in [s, s+m), w[<0] = 0
    and d = 0 past the end."""
    n = w.numel()
    e = min(s + m, n)
    lo = min(max(s, dim), e)
    d[: lo - s].copy_(w[s:lo])
    if e > lo:
        torch.sub(w[lo:e], w[lo - dim: e - dim], out=d[lo - s: e - s])
    d[e - s:].zero_()


# SWAR population count of int64 values (bit tricks: pair, nibble and byte sums)
_M1, _M2, _M4 = 0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F


def _popcount(v: torch.Tensor, width: int) -> torch.Tensor:
    """Set bits of the low `width` bits of each word of v, as int64."""
    x = v.to(torch.int64)
    if width < 64:
        x = x.bitwise_and_((1 << width) - 1)
    x = x - x.bitwise_right_shift(1).bitwise_and_(_M1)
    x = x.bitwise_and(_M2).add_(x.bitwise_right_shift_(2).bitwise_and_(_M2))
    x = x.add_(x.bitwise_right_shift(4)).bitwise_and_(_M4)
    return x.mul_(_LOW_BITS).bitwise_right_shift_(56)


def kept_words(w: torch.Tensor, dim: int) -> torch.Tensor:
    """How many transposed words of a message are non-zero (its body size), as a device
    scalar, without transposing: word k of a chunk of W residuals holds bit k of each, so
    the chunk keeps popcount(OR of its W zigzagged residuals) words. Scratch: two slices."""
    dev, width = w.device, w.element_size() * 8
    npad, _ = _sizes(w.numel(), width)
    step = min(SLICE_WORDS, npad)
    z, t = (torch.empty(step, dtype=w.dtype, device=dev) for _ in range(2))
    kept = torch.zeros((), dtype=torch.int64, device=dev)
    for s, m in _slices(npad):
        zs = z[:m]
        _delta_words(w, s, m, dim, zs)
        torch.bitwise_right_shift(zs, width - 1, out=t[:m])  # zigzag
        zs.bitwise_left_shift_(1).bitwise_xor_(t[:m])
        v, h = zs.view(m // width, width), width
        while h > 1:  # OR of each chunk's words, halving the columns
            h //= 2
            v[:, :h].bitwise_or_(v[:, h: 2 * h])
        kept += _popcount(v[:, 0], width).sum()
    return kept
