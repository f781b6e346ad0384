"""Fused Triton kernels for ZFP fixed-rate and blockwise int8/int4 (CUDA), bit-identical to
the torch reference codecs (zfp_torch.py, quant.py).

The torch codecs run ~100 tensor ops per chunk; on a GPU each is a kernel launch and a
pass over memory, far from device bandwidth. These kernels do one pass: one lane per ZFP
block (16 values) or one program per quantization block. They follow the torch code step
by step, using the same lookup tables for the bit-plane coder, IEEE round-to-nearest
division (``div_rn``, not the GPU's fast approximate one) and round-half-even by the fp32
magic-number add, so the bytes and values are the same as on CPU.

Used for CUDA tensors when Triton imports (``available()``); tests run the kernels on CPU
tensors under Triton's interpreter (TRITON_INTERPRET=1, set before this module imports).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from neoxlab.compress import zfp_torch

_ZFP_ENCODE_LANES = 128  # ZFP blocks per program: one thread each, 4 warps
_ZFP_DECODE_LANES = 128
_MAX_QBLOCK = 4096  # largest quantization block the fused kernel takes (else torch)
# no multiply-add contraction: torch rounds x * inv before adding the rounding constant
_EXACT = {"enable_fp_fusion": False}


def available(device: torch.device) -> bool:
    """Whether these kernels run for tensors on device (CUDA, or any under the interpreter)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


# -- shared helpers -------------------------------------------------------------------------------

@triton.jit
def _store_float(ptr, offs, v, mask, BF16: tl.constexpr):
    """Store fp32 v in ptr's type; bf16 (passed as int16) is rounded to nearest even here,
    bit for bit as torch does (Triton's interpreter truncates)."""
    if BF16:
        bits = v.to(tl.int32, bitcast=True)
        r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
        r = tl.where(v != v, 0x7FC0, r)
        tl.store(ptr + offs, r.to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_lift(x, y, z, w):
    x += w
    x = x >> 1
    w -= x
    z += y
    z = z >> 1
    y -= z
    x += z
    x = x >> 1
    z -= x
    w += y
    w = w >> 1
    y -= w
    w += y >> 1
    y -= w >> 1
    return x, y, z, w


@triton.jit
def _inv_lift(x, y, z, w):
    y += w >> 1
    w -= y >> 1
    y += w
    w = w << 1
    w -= y
    z += x
    x = x << 1
    x -= z
    y += z
    z = z << 1
    z -= y
    w += x
    x = x << 1
    x -= w
    return x, y, z, w


# -- ZFP encode -----------------------------------------------------------------------------------

@triton.jit
def _src_row(nr, Y: tl.constexpr):
    """Source row of a block's row Y (0-3) when the block has nr rows: ZFP pads a last
    block of nr < 4 rows with rows 0,0,0,0 / 0,1,1,0 / 0,1,2,0."""
    if Y == 0:
        r = nr * 0
    elif Y == 1:
        r = tl.where(nr > 1, 1, 0)
    elif Y == 2:
        r = tl.where(nr > 2, 2, tl.where(nr == 2, 1, 0))
    else:
        r = tl.where(nr > 3, 3, 0)
    return r


@triton.jit
def _zfp_blocks(pid, rows, LANES: tl.constexpr):
    """The ZFP blocks of program `pid` (one per lane) and how many rows of 4 values each
    has (4, or 1-3 for a last, padded one). In 64 bits: a message of 2^31 values or more
    would wrap a 32-bit index (decode and int8/int4 are 64-bit too)."""
    b = pid.to(tl.int64) * LANES + tl.arange(0, LANES)
    return b, tl.minimum(rows - 4 * b, 4)


@triton.jit
def _value_index(b, nr, Y: tl.constexpr, X: tl.constexpr):
    """Source index of value (Y, X) of each lane's block: row-major rows of 4 values."""
    return (4 * b + _src_row(nr, Y)) * 4 + X


@triton.jit
def _load_value(x_ptr, b, nr, live, Y: tl.constexpr, X: tl.constexpr):
    """Value (Y, X) of each lane's block, as fp32."""
    return tl.load(x_ptr + _value_index(b, nr, Y, X), mask=live, other=0.0).to(tl.float32)


@triton.jit
def _fixed(f, s):
    """ZFP's block-floating-point integer of f at scale s (fp32 product, as ZFP computes
    it; out of range: INT_MIN, as x86 converts)."""
    prod = f * s
    prod = tl.where(tl.abs(prod) < 2147483648.0, prod, -2147483648.0)
    return prod.to(tl.int32)


@triton.jit
def _nega(p):
    nbm = -1431655766  # 0xaaaaaaaa as int32
    return (p + nbm) ^ nbm


@triton.jit
def _bit(q, k, J: tl.constexpr):
    return ((q >> k) & 1) << J


@triton.jit
def _word_of(w0, w1, w2, w3, w4, w5, w6, w7, J: tl.constexpr):
    if J == 0:
        w = w0
    elif J == 1:
        w = w1
    elif J == 2:
        w = w2
    elif J == 3:
        w = w3
    elif J == 4:
        w = w4
    elif J == 5:
        w = w5
    elif J == 6:
        w = w6
    else:
        w = w7
    return w


@triton.jit
def _zfp_encode_kernel(x_ptr, out_ptr, enc_ptr, bitlen_ptr, rows, nblocks,
                       RATE: tl.constexpr, LANES: tl.constexpr, NBYTES_P2: tl.constexpr):
    """One thread per ZFP block (LANES blocks a program, LANES / 32 warps): the block's 16
    values are 16 registers of its thread, so no work is repeated across threads; per bit
    plane one load from each lookup table."""
    b, nr = _zfp_blocks(tl.program_id(0), rows, LANES)
    live = b < nblocks
    f0 = _load_value(x_ptr, b, nr, live, 0, 0)
    f1 = _load_value(x_ptr, b, nr, live, 0, 1)
    f2 = _load_value(x_ptr, b, nr, live, 0, 2)
    f3 = _load_value(x_ptr, b, nr, live, 0, 3)
    f4 = _load_value(x_ptr, b, nr, live, 1, 0)
    f5 = _load_value(x_ptr, b, nr, live, 1, 1)
    f6 = _load_value(x_ptr, b, nr, live, 1, 2)
    f7 = _load_value(x_ptr, b, nr, live, 1, 3)
    f8 = _load_value(x_ptr, b, nr, live, 2, 0)
    f9 = _load_value(x_ptr, b, nr, live, 2, 1)
    f10 = _load_value(x_ptr, b, nr, live, 2, 2)
    f11 = _load_value(x_ptr, b, nr, live, 2, 3)
    f12 = _load_value(x_ptr, b, nr, live, 3, 0)
    f13 = _load_value(x_ptr, b, nr, live, 3, 1)
    f14 = _load_value(x_ptr, b, nr, live, 3, 2)
    f15 = _load_value(x_ptr, b, nr, live, 3, 3)
    # the largest magnitude, and whether any value is NaN/Inf (then the block is marked)
    m01 = tl.maximum(tl.abs(f0), tl.abs(f1))
    m23 = tl.maximum(tl.abs(f2), tl.abs(f3))
    m45 = tl.maximum(tl.abs(f4), tl.abs(f5))
    m67 = tl.maximum(tl.abs(f6), tl.abs(f7))
    m89 = tl.maximum(tl.abs(f8), tl.abs(f9))
    mab = tl.maximum(tl.abs(f10), tl.abs(f11))
    mcd = tl.maximum(tl.abs(f12), tl.abs(f13))
    mef = tl.maximum(tl.abs(f14), tl.abs(f15))
    amax = tl.maximum(tl.maximum(tl.maximum(m01, m23), tl.maximum(m45, m67)),
                      tl.maximum(tl.maximum(m89, mab), tl.maximum(mcd, mef)))
    nan = ((f0 != f0) | (f1 != f1) | (f2 != f2) | (f3 != f3) | (f4 != f4) | (f5 != f5)
           | (f6 != f6) | (f7 != f7) | (f8 != f8) | (f9 != f9) | (f10 != f10) | (f11 != f11)
           | (f12 != f12) | (f13 != f13) | (f14 != f14) | (f15 != f15))
    bad = nan | (amax == float("inf"))  # (whatever the max makes of a NaN operand)
    amax = tl.where(bad, 0.0, amax)
    expo = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    emax = tl.maximum(expo - 126, -126)
    nonzero = (amax > 0) & (~bad)
    e2 = 157 - emax  # biased exponent of 2^(30 - emax); >= 255 overflows to inf
    s = tl.where(e2 >= 255, 0x7F800000, e2 << 23).to(tl.float32, bitcast=True)
    p0 = _fixed(f0, s)
    p1 = _fixed(f1, s)
    p2 = _fixed(f2, s)
    p3 = _fixed(f3, s)
    p4 = _fixed(f4, s)
    p5 = _fixed(f5, s)
    p6 = _fixed(f6, s)
    p7 = _fixed(f7, s)
    p8 = _fixed(f8, s)
    p9 = _fixed(f9, s)
    p10 = _fixed(f10, s)
    p11 = _fixed(f11, s)
    p12 = _fixed(f12, s)
    p13 = _fixed(f13, s)
    p14 = _fixed(f14, s)
    p15 = _fixed(f15, s)
    # rows (along x), then columns (along y)
    p0, p1, p2, p3 = _fwd_lift(p0, p1, p2, p3)
    p4, p5, p6, p7 = _fwd_lift(p4, p5, p6, p7)
    p8, p9, p10, p11 = _fwd_lift(p8, p9, p10, p11)
    p12, p13, p14, p15 = _fwd_lift(p12, p13, p14, p15)
    p0, p4, p8, p12 = _fwd_lift(p0, p4, p8, p12)
    p1, p5, p9, p13 = _fwd_lift(p1, p5, p9, p13)
    p2, p6, p10, p14 = _fwd_lift(p2, p6, p10, p14)
    p3, p7, p11, p15 = _fwd_lift(p3, p7, p11, p15)
    # sequency order PERM = (0, 1, 4, 5, 2, 8, 6, 9, 3, 12, 10, 7, 13, 11, 14, 15), negabinary
    q0 = _nega(p0)
    q1 = _nega(p1)
    q2 = _nega(p4)
    q3 = _nega(p5)
    q4 = _nega(p2)
    q5 = _nega(p8)
    q6 = _nega(p6)
    q7 = _nega(p9)
    q8 = _nega(p3)
    q9 = _nega(p12)
    q10 = _nega(p10)
    q11 = _nega(p7)
    q12 = _nega(p13)
    q13 = _nega(p11)
    q14 = _nega(p14)
    q15 = _nega(p15)
    maxbits = 16 * RATE
    off = tl.full([LANES], 9, tl.int64)
    acc = tl.zeros([LANES], dtype=tl.int32)
    w0 = tl.zeros([LANES], dtype=tl.int64)
    w1 = tl.zeros([LANES], dtype=tl.int64)
    w2 = tl.zeros([LANES], dtype=tl.int64)
    w3 = tl.zeros([LANES], dtype=tl.int64)
    w4 = tl.zeros([LANES], dtype=tl.int64)
    w5 = tl.zeros([LANES], dtype=tl.int64)
    w6 = tl.zeros([LANES], dtype=tl.int64)
    w7 = tl.zeros([LANES], dtype=tl.int64)
    w8 = tl.zeros([LANES], dtype=tl.int64)
    one = tl.full([LANES], 1, tl.int64)
    for i in range(32):
        k = 31 - i
        # bit plane k of the 16 values: bit j of xk is bit k of value j
        xk = (_bit(q0, k, 0) | _bit(q1, k, 1) | _bit(q2, k, 2) | _bit(q3, k, 3)
              | _bit(q4, k, 4) | _bit(q5, k, 5) | _bit(q6, k, 6) | _bit(q7, k, 7)
              | _bit(q8, k, 8) | _bit(q9, k, 9) | _bit(q10, k, 10) | _bit(q11, k, 11)
              | _bit(q12, k, 12) | _bit(q13, k, 13) | _bit(q14, k, 14) | _bit(q15, k, 15))
        n = tl.load(bitlen_ptr + acc).to(tl.int64)
        ent = tl.load(enc_ptr + n * 65536 + xk)
        code = ent & 0xFFFFFFFFFF
        ln = ent >> 40
        keep = tl.minimum(tl.maximum(maxbits - off, 0), ln)
        code = tl.where(nonzero, code & ((one << keep) - 1), 0)
        word = off >> 6
        sh = off & 63
        lo = code << sh
        hi = (code >> 1) >> (63 - sh)
        w0 |= tl.where(word == 0, lo, 0)
        w1 |= tl.where(word == 1, lo, 0) | tl.where(word == 0, hi, 0)
        w2 |= tl.where(word == 2, lo, 0) | tl.where(word == 1, hi, 0)
        w3 |= tl.where(word == 3, lo, 0) | tl.where(word == 2, hi, 0)
        w4 |= tl.where(word == 4, lo, 0) | tl.where(word == 3, hi, 0)
        w5 |= tl.where(word == 5, lo, 0) | tl.where(word == 4, hi, 0)
        w6 |= tl.where(word == 6, lo, 0) | tl.where(word == 5, hi, 0)
        w7 |= tl.where(word == 7, lo, 0) | tl.where(word == 6, hi, 0)
        w8 |= tl.where(word == 8, lo, 0) | tl.where(word == 7, hi, 0)
        off += ln
        acc |= xk
    head = tl.where(nonzero, 1 + 2 * (emax.to(tl.int64) + 127), 0)
    w0 |= tl.where(bad, 1, head)
    for j in tl.static_range(2 * RATE):
        w = _word_of(w0, w1, w2, w3, w4, w5, w6, w7, j // 8)
        byte = ((w >> ((j % 8) * 8)) & 255).to(tl.uint8)
        tl.store(out_ptr + b * (2 * RATE) + j, byte, mask=live)


def zfp_encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.encode."""
    rows = vals.numel() // 4
    nblocks = -(-rows // 4)
    enc = zfp_torch._encode_table(vals.device)
    bitlen = zfp_torch._bitlen_table(vals.device)
    grid = (triton.cdiv(nblocks, _ZFP_ENCODE_LANES),)
    _zfp_encode_kernel[grid](vals, out, enc, bitlen, rows, nblocks, RATE=rate,
                             LANES=_ZFP_ENCODE_LANES,
                             NBYTES_P2=triton.next_power_of_2(2 * rate),
                             num_warps=_ZFP_ENCODE_LANES // 32, **_EXACT)


# -- ZFP decode -----------------------------------------------------------------------------------

@triton.jit
def _payload_word(in_ptr, base, live, J: tl.constexpr, NBYTES: tl.constexpr):
    """Bytes 8J .. 8J + 7 of each lane's block payload as one int64, LSB first (bytes past
    the payload: 0). Read once: the bit-plane decoder then reads its windows from these."""
    w = base * 0
    for i in tl.static_range(8):
        if 8 * J + i < NBYTES:
            byte = tl.load(in_ptr + base + (8 * J + i), mask=live, other=0).to(tl.int64)
            w |= byte << (8 * i)
    return w


@triton.jit
def _pick(j, w0, w1, w2, w3, w4, w5, w6, w7):
    """Word j (0-8; 8 and past: the zero word after the payload) of a block's payload."""
    return tl.where(j == 0, w0, tl.where(j == 1, w1, tl.where(j == 2, w2, tl.where(
        j == 3, w3, tl.where(j == 4, w4, tl.where(j == 5, w5, tl.where(
            j == 6, w6, tl.where(j == 7, w7, 0))))))))


@triton.jit
def _window(pos, w0, w1, w2, w3, w4, w5, w6, w7):
    """The 16 bits at bit offset pos of each lane's payload (LSB first), from registers."""
    j = pos >> 6
    sh = pos & 63
    a = _pick(j, w0, w1, w2, w3, w4, w5, w6, w7)
    b = _pick(j + 1, w0, w1, w2, w3, w4, w5, w6, w7)
    spill = sh > 48  # the window runs into the next word
    lo = (a >> sh) & tl.where(spill, (1 << (64 - sh)) - 1, 0xFFFF)  # (no sign bits)
    hi = tl.where(spill, (b << (64 - sh)) & 0xFFFF, 0)
    return lo | hi


@triton.jit
def _bits_of(x, j: tl.constexpr, k):
    """Bit j of the plane x, placed at bit k of value j's integer."""
    return (((x >> j) & 1) << k).to(tl.int32)


@triton.jit
def _ints(u):
    nbm = -1431655766  # from negabinary
    return (u ^ nbm) - nbm


@triton.jit
def _store_value(out_ptr, bl, p, s, nonzero, nan, live, n4, AT: tl.constexpr,
                 BF16: tl.constexpr):
    v = p.to(tl.float32) * s
    v = tl.where(nonzero, v, 0.0)
    v = tl.where(nan, float("nan"), v)
    dst = bl * 16 + AT
    _store_float(out_ptr, dst, v, live & (dst < n4), BF16)


@triton.jit
def _zfp_decode_kernel(in_ptr, out_ptr, dec_ptr, n4, nblocks,
                       RATE: tl.constexpr, LANES: tl.constexpr, STATE: tl.constexpr,
                       STEPS: tl.constexpr, BF16: tl.constexpr):
    """One thread per ZFP block (LANES blocks a program, LANES / 32 warps): the block's
    payload is read once into registers (2 * RATE byte loads) and the coder's windows come
    from there; the 16 values' bits gather in 16 registers; per plane one decode-table load
    per step (the budget's class is computed, as zfp_torch._budget_class tabulates it)."""
    b = tl.program_id(0).to(tl.int64) * LANES + tl.arange(0, LANES)
    live = b < nblocks
    bl = tl.where(live, b, 0)
    nbytes: tl.constexpr = 2 * RATE
    base = bl * nbytes
    w0 = _payload_word(in_ptr, base, live, 0, nbytes)
    w1 = _payload_word(in_ptr, base, live, 1, nbytes)
    w2 = _payload_word(in_ptr, base, live, 2, nbytes)
    w3 = _payload_word(in_ptr, base, live, 3, nbytes)
    w4 = _payload_word(in_ptr, base, live, 4, nbytes)
    w5 = _payload_word(in_ptr, base, live, 5, nbytes)
    w6 = _payload_word(in_ptr, base, live, 6, nbytes)
    w7 = _payload_word(in_ptr, base, live, 7, nbytes)
    head = w0 & 0x1FF
    flag = (head & 1) == 1
    e = head >> 1
    nonzero = flag & (e > 0)
    nan = flag & (e == 0)
    emax = (e - 127).to(tl.int32)
    maxbits = 16 * RATE
    pos = tl.full([LANES], 9, tl.int64)
    budget = tl.where(nonzero, maxbits - 9, 0).to(tl.int64)
    n = tl.zeros([LANES], dtype=tl.int64)
    one = tl.full([LANES], 1, tl.int64)
    u0 = tl.zeros([LANES], dtype=tl.int32)
    u1 = tl.zeros([LANES], dtype=tl.int32)
    u2 = tl.zeros([LANES], dtype=tl.int32)
    u3 = tl.zeros([LANES], dtype=tl.int32)
    u4 = tl.zeros([LANES], dtype=tl.int32)
    u5 = tl.zeros([LANES], dtype=tl.int32)
    u6 = tl.zeros([LANES], dtype=tl.int32)
    u7 = tl.zeros([LANES], dtype=tl.int32)
    u8 = tl.zeros([LANES], dtype=tl.int32)
    u9 = tl.zeros([LANES], dtype=tl.int32)
    u10 = tl.zeros([LANES], dtype=tl.int32)
    u11 = tl.zeros([LANES], dtype=tl.int32)
    u12 = tl.zeros([LANES], dtype=tl.int32)
    u13 = tl.zeros([LANES], dtype=tl.int32)
    u14 = tl.zeros([LANES], dtype=tl.int32)
    u15 = tl.zeros([LANES], dtype=tl.int32)
    for i in range(32):
        k = 31 - i
        m = tl.minimum(n, budget)
        x = _window(pos, w0, w1, w2, w3, w4, w5, w6, w7) & ((one << m) - 1)
        pos += m
        budget -= m
        state = n * (3 * STATE)
        for _ in tl.static_range(STEPS):
            byte = _window(pos, w0, w1, w2, w3, w4, w5, w6, w7) & 0xFF
            vc = (tl.minimum(budget, 8) + 9 * (budget <= 8).to(tl.int64)) * 256
            ent = tl.load(dec_ptr + state + vc + byte)
            x |= ent & 0xFFFF
            used = (ent >> 16) & 0xFF
            pos += used
            budget -= used
            state = ent >> 24
        n = state // (3 * STATE)
        u0 |= _bits_of(x, 0, k)
        u1 |= _bits_of(x, 1, k)
        u2 |= _bits_of(x, 2, k)
        u3 |= _bits_of(x, 3, k)
        u4 |= _bits_of(x, 4, k)
        u5 |= _bits_of(x, 5, k)
        u6 |= _bits_of(x, 6, k)
        u7 |= _bits_of(x, 7, k)
        u8 |= _bits_of(x, 8, k)
        u9 |= _bits_of(x, 9, k)
        u10 |= _bits_of(x, 10, k)
        u11 |= _bits_of(x, 11, k)
        u12 |= _bits_of(x, 12, k)
        u13 |= _bits_of(x, 13, k)
        u14 |= _bits_of(x, 14, k)
        u15 |= _bits_of(x, 15, k)
    # inverse of PERM: block position PERM[i] gets coefficient i
    p0 = _ints(u0)
    p1 = _ints(u1)
    p4 = _ints(u2)
    p5 = _ints(u3)
    p2 = _ints(u4)
    p8 = _ints(u5)
    p6 = _ints(u6)
    p9 = _ints(u7)
    p3 = _ints(u8)
    p12 = _ints(u9)
    p10 = _ints(u10)
    p7 = _ints(u11)
    p13 = _ints(u12)
    p11 = _ints(u13)
    p14 = _ints(u14)
    p15 = _ints(u15)
    # columns (along y), then rows (along x)
    p0, p4, p8, p12 = _inv_lift(p0, p4, p8, p12)
    p1, p5, p9, p13 = _inv_lift(p1, p5, p9, p13)
    p2, p6, p10, p14 = _inv_lift(p2, p6, p10, p14)
    p3, p7, p11, p15 = _inv_lift(p3, p7, p11, p15)
    p0, p1, p2, p3 = _inv_lift(p0, p1, p2, p3)
    p4, p5, p6, p7 = _inv_lift(p4, p5, p6, p7)
    p8, p9, p10, p11 = _inv_lift(p8, p9, p10, p11)
    p12, p13, p14, p15 = _inv_lift(p12, p13, p14, p15)
    # s = 2^(emax - 30) in fp32: subnormal below 2^-126, 0 below 2^-149 (as ldexpf)
    sexp = emax - 30
    s_norm = ((sexp + 127) << 23).to(tl.float32, bitcast=True)
    s_sub = (1 << tl.minimum(tl.maximum(sexp + 149, 0), 22)).to(tl.float32, bitcast=True)
    s = tl.where(sexp >= -126, s_norm, tl.where(sexp >= -149, s_sub, 0.0))
    _store_value(out_ptr, bl, p0, s, nonzero, nan, live, n4, 0, BF16)
    _store_value(out_ptr, bl, p1, s, nonzero, nan, live, n4, 1, BF16)
    _store_value(out_ptr, bl, p2, s, nonzero, nan, live, n4, 2, BF16)
    _store_value(out_ptr, bl, p3, s, nonzero, nan, live, n4, 3, BF16)
    _store_value(out_ptr, bl, p4, s, nonzero, nan, live, n4, 4, BF16)
    _store_value(out_ptr, bl, p5, s, nonzero, nan, live, n4, 5, BF16)
    _store_value(out_ptr, bl, p6, s, nonzero, nan, live, n4, 6, BF16)
    _store_value(out_ptr, bl, p7, s, nonzero, nan, live, n4, 7, BF16)
    _store_value(out_ptr, bl, p8, s, nonzero, nan, live, n4, 8, BF16)
    _store_value(out_ptr, bl, p9, s, nonzero, nan, live, n4, 9, BF16)
    _store_value(out_ptr, bl, p10, s, nonzero, nan, live, n4, 10, BF16)
    _store_value(out_ptr, bl, p11, s, nonzero, nan, live, n4, 11, BF16)
    _store_value(out_ptr, bl, p12, s, nonzero, nan, live, n4, 12, BF16)
    _store_value(out_ptr, bl, p13, s, nonzero, nan, live, n4, 13, BF16)
    _store_value(out_ptr, bl, p14, s, nonzero, nan, live, n4, 14, BF16)
    _store_value(out_ptr, bl, p15, s, nonzero, nan, live, n4, 15, BF16)


def zfp_decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.decode."""
    n4 = out.numel()
    nblocks = -(-n4 // 16)
    dec = zfp_torch._decode_table(out.device)
    grid = (triton.cdiv(nblocks, _ZFP_DECODE_LANES),)
    _zfp_decode_kernel[grid](payload, *_float_out(out), dec, n4, nblocks, RATE=rate,
                             LANES=_ZFP_DECODE_LANES, STATE=zfp_torch._STATE,
                             STEPS=zfp_torch._STEPS, BF16=out.dtype == torch.bfloat16,
                             num_warps=_ZFP_DECODE_LANES // 32, **_EXACT)


def _float_out(out: torch.Tensor) -> tuple[torch.Tensor]:
    """bf16 outputs are written as int16 bit patterns (see _store_float)."""
    return (out.view(torch.int16) if out.dtype == torch.bfloat16 else out,)


# -- blockwise int8 / int4 ------------------------------------------------------------------------

@triton.jit
def _quant_encode_kernel(x_ptr, scale_ptr, code_ptr, n, BLOCK: tl.constexpr,
                         BLOCK_P2: tl.constexpr, QMAX: tl.constexpr, BITS: tl.constexpr):
    blk = tl.program_id(0).to(tl.int64)
    idx = blk * BLOCK + tl.arange(0, BLOCK_P2)
    m = (tl.arange(0, BLOCK_P2) < BLOCK) & (idx < n)
    x = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32)
    a = tl.abs(x)
    hasnan = tl.max(tl.where(x != x, 1, 0), axis=0) > 0
    amax = tl.where(hasnan, float("nan"), tl.max(a, axis=0))
    tl.store(scale_ptr + blk, tl.math.div_rn(amax, QMAX * 1.0))
    inv = tl.math.div_rn(1.0, amax) * QMAX  # torch computes qmax / t as qmax * (1 / t)
    inv = tl.where((inv != inv) | (inv == float("inf")), 0.0, inv)
    q = x * inv
    q = (q + 12582912.0) - 12582912.0  # round half to even (|q| <= QMAX)
    q = tl.where(q != q, 0.0, q)
    if BITS == 8:
        tl.store(code_ptr + idx, q.to(tl.int8), mask=m)
    else:
        nib = tl.where(m, q.to(tl.int32) + 8, 0)
        lo, hi = tl.split(tl.reshape(nib, (BLOCK_P2 // 2, 2)))
        pidx = blk * (BLOCK // 2) + tl.arange(0, BLOCK_P2 // 2)
        pm = (tl.arange(0, BLOCK_P2 // 2) < BLOCK // 2) & (pidx < (n + 1) // 2)
        tl.store(code_ptr + pidx, (lo | (hi << 4)).to(tl.uint8), mask=pm)


@triton.jit
def _quant_decode_kernel(scale_ptr, code_ptr, out_ptr, n, BLOCK: tl.constexpr,
                         BLOCK_P2: tl.constexpr, BITS: tl.constexpr, BF16: tl.constexpr):
    blk = tl.program_id(0).to(tl.int64)
    idx = blk * BLOCK + tl.arange(0, BLOCK_P2)
    m = (tl.arange(0, BLOCK_P2) < BLOCK) & (idx < n)
    scale = tl.load(scale_ptr + blk)
    if BITS == 8:
        q = tl.load(code_ptr + idx, mask=m, other=0).to(tl.float32)
    else:
        byte = tl.load(code_ptr + idx // 2, mask=m, other=0).to(tl.int32)
        q = (((byte >> ((idx % 2) * 4).to(tl.int32)) & 15) - 8).to(tl.float32)
    _store_float(out_ptr, idx, q * scale, m, BF16)


def quant_supported(block: int) -> bool:
    return block <= _MAX_QBLOCK


def quant_encode(flat: torch.Tensor, block: int, qmax: int, bits: int,
                 scales: torch.Tensor, codes: torch.Tensor) -> None:
    """scales: fp32 per block; codes: int8 (uint8 storage) or packed nibbles."""
    n = flat.numel()
    grid = (-(-n // block),)
    _quant_encode_kernel[grid](flat, scales, codes, n, BLOCK=block,
                               BLOCK_P2=triton.next_power_of_2(block), QMAX=qmax, BITS=bits,
                               **_EXACT)


def quant_decode(scales: torch.Tensor, codes: torch.Tensor, out: torch.Tensor, block: int,
                 bits: int) -> None:
    n = out.numel()
    grid = (-(-n // block),)
    _quant_decode_kernel[grid](scales, codes, *_float_out(out), n, BLOCK=block,
                               BLOCK_P2=triton.next_power_of_2(block), BITS=bits,
                               BF16=out.dtype == torch.bfloat16, **_EXACT)
