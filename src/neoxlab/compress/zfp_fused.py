"""ZFP fixed-rate chunk coders written one block per lane, as stages for torch.compile.

The reference coder (zfp_torch.py) runs ~100 whole-chunk tensor ops per chunk, each a pass
over memory. These stages compute the same bytes with the structure of the Triton kernels:
every step is elementwise over the blocks of a chunk ((nb,) vectors, one per coefficient
or bit plane; Python loops unrolled over the 16 values), so inductor's C++ backend fuses a
stage into one OpenMP loop over blocks. Differences from the reference that only change
the work: the exponent and the bit length of the planes above are read off fp32 bit
patterns instead of frexp and a table; the decoder reads the stream as int64 words, two
per plane (a plane's code is at most 16 + 31 bits) instead of five 24-bit reads, and
computes the budget class instead of looking it up. Fixed rate bounds every block's bits,
so the coders stop at the first plane (checked every 4th) below which no block has budget
left; that check reads a flag on the host, so these stages are for CPU tensors. Eagerly
the stages are slow (thousands of tiny ops); zfp_compiled.py compiles them. The driver
functions encode_chunk/decode_chunk take the (compiled or eager) stages as arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from neoxlab.compress.bitplanes import STAGES
from neoxlab.compress.zfp_torch import _EBIAS, _INT_MIN, _STATE, _STEPS, PERM

_NB = -0x55555556  # 0xaaaaaaaa as int32
_INT64_MAX = (1 << 63) - 1
T = torch.Tensor
Lift = Callable[[T, T, T, T], tuple[T, T, T, T]]


def _w(v: T) -> T:
    """The int32 value of v's low 32 bits. The lifts run in int64 and wrap before every
    right shift: int32 overflow is undefined in C++, and inductor's compiled int32 lifts
    gave other bits than eager torch on blocks of INT_MIN."""
    return v.to(torch.int32).to(torch.int64)


def _fwd_lift(x: T, y: T, z: T, w: T) -> tuple[T, T, T, T]:
    x = _w(x + w) >> 1; w = w - x  # noqa: E702
    z = _w(z + y) >> 1; y = y - z  # noqa: E702
    x = _w(x + z) >> 1; z = z - x  # noqa: E702
    w = _w(w + y) >> 1; y = y - w  # noqa: E702
    y = _w(y); w = _w(w + (y >> 1)); y = _w(y - (w >> 1))  # noqa: E702
    return x, y, _w(z), w


def _inv_lift(x: T, y: T, z: T, w: T) -> tuple[T, T, T, T]:
    y = _w(y + (w >> 1)); w = _w(w - (y >> 1))  # noqa: E702
    y = y + w; w = (w << 1) - y  # noqa: E702
    z = z + x; x = (x << 1) - z  # noqa: E702
    y = y + z; z = (z << 1) - y  # noqa: E702
    w = w + x; x = (x << 1) - w  # noqa: E702
    return _w(x), _w(y), _w(z), _w(w)


def _transpose16(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """16 x 16 bit-matrix transpose of 16 int64 vectors holding 16-bit words: afterwards
    bit r of out[k] is bit k of rows[r] (the stages of bitplanes.transpose_planes)."""
    z = list(rows)
    for j, mask in STAGES[16]:
        for r in range(16):
            if r & j:
                continue
            a, b = z[r], z[r + j]
            t = ((a >> j) ^ b) & mask
            z[r + j] = b ^ t
            z[r] = a ^ (t << j)
    return z


def _planes(u: list[torch.Tensor]) -> list[torch.Tensor]:
    """16 values (int64, low 32 bits) -> 32 planes, bit i of planes[k] = bit k of u[i]:
    two 16 x 16 transposes of the 16-bit halves."""
    lo = [(v & 0xFFFF).to(torch.int64) for v in u]
    hi = [((v >> 16) & 0xFFFF).to(torch.int64) for v in u]
    return _transpose16(lo) + _transpose16(hi)


def _values(planes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Inverse of _planes (planes of 16 bits -> 32-bit values as int64)."""
    lo, hi = _transpose16(planes[:16]), _transpose16(planes[16:])
    return [a | (b << 16) for a, b in zip(lo, hi, strict=True)]


def _lift_block(cols: list[torch.Tensor], lift: Lift, order: str) -> list[torch.Tensor]:
    """Apply lift to the 4 rows then the 4 columns (order "rc") or the reverse ("cr") of
    a 4x4 block held as 16 vectors, index i + 4 j (i along a row)."""
    p = list(cols)
    for step in order:
        for g in range(4):
            idx = [4 * g + i for i in range(4)] if step == "r" else [g + 4 * i for i in range(4)]
            out = lift(*(p[i] for i in idx))
            for i, v in zip(idx, out, strict=True):
                p[i] = v
    return p


def encode_prologue(fb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nb, 16) fp32 blocks -> (bit planes (32, nb) int64, row k = plane k of the 16
    values; nonzero (nb,) bool; header (nb,) int64: the block's first 9 bits)."""
    mag = [c & 0x7FFFFFFF for c in fb.view(torch.int32).unbind(1)]
    amag = mag[0]
    for c in mag[1:]:  # |x| ordered as its bit pattern; >= 0x7F800000 is NaN or Inf
        amag = amag.maximum(c)
    finite = amag < 0x7F800000
    expo = (amag >> 23) & 0xFF
    emax = torch.clamp(expo - (_EBIAS - 1), min=1 - _EBIAS)
    nonzero = finite & (amag > 0)
    e2 = (_EBIAS + 30) - emax  # biased exponent of 2^(30 - emax); >= 255 is inf in fp32
    s = torch.where(e2 >= 255, 0x7F800000, e2 << 23).to(torch.int32).view(torch.float32)
    prod = fb * s[:, None]
    prod = torch.where(finite[:, None] & (prod.abs() < 2.0**31), prod, float(_INT_MIN))
    ib = prod.to(torch.int32).to(torch.int64)  # ZFP's int32 arithmetic, wrapped (_w)
    p = _lift_block(list(ib.unbind(1)), _fwd_lift, "rc")
    u = [(p[PERM[i]] + _NB) ^ _NB for i in range(16)]
    planes = _planes(u)  # planes[k]: bit k of the 16 values
    head = torch.where(nonzero, 1 + 2 * (emax.to(torch.int64) + _EBIAS), 0)
    return torch.stack(planes), nonzero, torch.where(finite, head, 1)


def encode_plane(xk: torch.Tensor, acc: torch.Tensor, off: torch.Tensor,
                 words: torch.Tensor, nonzero: torch.Tensor, rate: int, enc: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Code one bit plane xk (nb,) of every block: acc = OR of the planes above, off = bits
    written so far, words (nwords, nb) int64 the stream; returns the updated three."""
    maxbits = 16 * rate
    # n = bit length of acc (< 2^16: exact in fp32, read off the exponent)
    n = ((acc.to(torch.float32).view(torch.int32) >> 23) - 126).clamp(min=0)
    ent = enc[n.to(torch.int64) * 65536 + xk]
    code, length = ent & ((1 << 40) - 1), ent >> 40
    keep = torch.clamp(maxbits - off, min=0).minimum(length)
    code = torch.where(nonzero, code & ((1 << keep) - 1), 0)
    word = off >> 6
    sh = off & 63
    lo = code << sh
    hi = (code >> 1) >> (63 - sh)
    out = [words[w] | torch.where(word == w, lo, 0) | torch.where(word == w - 1, hi, 0)
           for w in range(words.shape[0])]
    return acc | xk, off + length, torch.stack(out)


def encode_chunk(fb: torch.Tensor, rate: int, enc: torch.Tensor,
                 prologue: Callable = encode_prologue,
                 plane: Callable = encode_plane) -> torch.Tensor:
    """(nb, 16) fp32 blocks -> (nb, 2 rate) uint8, the same bytes as zfp_torch's encoder;
    enc is zfp_torch's code table; prologue and plane may be compiled versions."""
    planes, nonzero, head = prologue(fb)
    nb = fb.shape[0]
    acc = torch.zeros(nb, dtype=torch.int64, device=fb.device)
    off = acc + 9
    words = torch.zeros(-(-16 * rate // 64), nb, dtype=torch.int64, device=fb.device)
    words[0] = head
    spent = ~nonzero  # blocks whose budget is used up (zero and NaN blocks carry no planes)
    for k in range(31, -1, -1):
        acc, off, words = plane(planes[k], acc, off, words, nonzero, rate, enc)
        if k % 4 == 0 and bool((spent | (off >= 16 * rate)).all()):
            break  # fixed rate: the planes below would write nothing (a CPU-only check)
    return words.t().reshape(-1).view(torch.uint8).view(nb, -1)[:, : 2 * rate]


def decode_plane(words: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
                 budget: torch.Tensor, n: torch.Tensor, table: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode one bit plane of every block. words is the stream as int64 words (block b's
    first at base[b]); a plane's code is at most 16 + 31 bits, so the 64 bits at pos (two
    aligned words joined) cover it. Returns pos, budget, n after it and the plane."""
    at = (base + (pos >> 6)).clamp(max=words.numel() - 2)  # spent budgets read nothing
    lo, hi = words[at], words[at + 1]
    r = pos & 63
    lo = torch.where(r == 0, lo, ((lo >> 1) & _INT64_MAX) >> (r - 1).clamp(min=0))
    w = lo | ((hi << 1) << (63 - r))  # bits pos .. pos + 63, as unsigned shifts would
    m = n.minimum(budget)
    x = w & ((1 << m) - 1)
    rel = m
    budget = budget - m
    state = n * (3 * _STATE)
    for _ in range(_STEPS):
        vclass = (budget.clamp(max=8) + 9 * (budget <= 8).to(torch.int64)) * 256
        ent = table[state + vclass + ((w >> rel) & 0xFF)]
        x = x | (ent & 0xFFFF)
        used = (ent >> 16) & 0xFF
        rel = rel + used
        budget = budget - used
        state = ent >> 24
    return pos + rel, budget, state // (3 * _STATE), x


def decode_words(src: torch.Tensor) -> torch.Tensor:
    """(nb, nbytes) uint8 -> the stream as int64 words, each block padded to whole words,
    plus one zero word (so the last plane read has a second word). Little-endian."""
    pad = -src.shape[1] % 8
    blocks = torch.nn.functional.pad(src, (0, pad)) if pad else src.contiguous()
    return torch.nn.functional.pad(blocks.view(torch.int64).reshape(-1), (0, 1))


def decode_epilogue(planes: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Bit planes (32, nb) int64 and block headers (nb,) -> (nb, 16) fp32 values."""
    flag = (head & 1) == 1
    e = head >> 1
    nonzero = flag & (e > 0)
    nan = flag & (e == 0)
    vals = _values(list(planes.unbind(0)))  # vals[i]: value i (negabinary)
    ints = [_w((vals[i] ^ _NB) - _NB) for i in range(16)]
    p: list[torch.Tensor] = list(ints)
    for i in range(16):
        p[PERM[i]] = ints[i]
    p = _lift_block(p, _inv_lift, "cr")
    ib = torch.stack(p, 1).to(torch.int32)
    sexp = (e - _EBIAS - 30).to(torch.int32)
    s_norm = ((sexp + 127).clamp(min=0) << 23).view(torch.float32)
    s_sub = (1 << (sexp + 149).clamp(0, 22)).to(torch.int32).view(torch.float32)
    s = torch.where(sexp >= -126, s_norm, torch.where(sexp >= -149, s_sub, 0.0))
    vals_f = ib.float() * s[:, None]
    vals_f = torch.where(nonzero[:, None], vals_f, 0.0)
    return torch.where(nan[:, None], float("nan"), vals_f)


def decode_chunk(src: torch.Tensor, rate: int, table: torch.Tensor,
                 plane: Callable = decode_plane,
                 epilogue: Callable = decode_epilogue) -> torch.Tensor:
    """(nb, 2 rate) uint8 -> (nb, 16) fp32, as zfp_torch's decoder (table: its decode-state
    table); plane and epilogue may be compiled versions."""
    nb = src.shape[0]
    words = decode_words(src)
    per_block = -(-2 * rate // 8)
    head = words[: nb * per_block].view(nb, per_block)[:, 0] & 0x1FF
    nonzero = ((head & 1) == 1) & (head > 1)
    base = torch.arange(nb, device=src.device) * per_block
    pos = torch.full((nb,), 9, dtype=torch.int64, device=src.device)
    budget = torch.where(nonzero, 16 * rate - 9, 0)
    n = torch.zeros_like(pos)
    planes = torch.zeros(32, nb, dtype=torch.int64, device=src.device)
    for k in range(31, -1, -1):
        pos, budget, n, planes[k] = plane(words, base, pos, budget, n, table)
        if k % 4 == 0 and not bool(budget.any()):
            break  # every budget is spent: the planes below are zero (a CPU-only check)
    return epilogue(planes, head)
