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

import torch
import triton
import triton.language as tl

from neoxlab.compress import zfp_torch

_ZFP_LANES = 64  # ZFP blocks per program (decode: [blocks, 16] tiles)
_ZFP_ENCODE_LANES = 128  # ZFP blocks per encode program: one thread each, 4 warps
_MAX_QBLOCK = 4096  # largest quantization block the fused kernel takes (else torch)
# no multiply-add contraction: torch rounds x * inv before adding the rounding constant
_EXACT = {"enable_fp_fusion": False}


def available(device: torch.device) -> bool:
    """Whether these kernels run for tensors on device (CUDA, or any under the interpreter)."""
    import os

    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


# -- shared helpers -------------------------------------------------------------------------------

@triton.jit
def _col(t, cols, j: tl.constexpr):
    """Column j of a [lanes, 16] tile as a [lanes] vector."""
    return tl.sum(tl.where(cols[None, :] == j, t, 0), axis=1)


@triton.jit
def _put(t, cols, j: tl.constexpr, v):
    return tl.where(cols[None, :] == j, v[:, None], t)


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
def _read16(in_ptr, base, pos, nbytes: tl.constexpr):
    """16 bits at bit offset pos of each lane's block (LSB first)."""
    at = pos >> 3
    b0 = tl.load(in_ptr + base + tl.minimum(at, nbytes - 1)).to(tl.int64)
    b1 = tl.load(in_ptr + base + tl.minimum(at + 1, nbytes - 1)).to(tl.int64)
    b2 = tl.load(in_ptr + base + tl.minimum(at + 2, nbytes - 1)).to(tl.int64)
    b1 = tl.where(at + 1 < nbytes, b1, 0)
    b2 = tl.where(at + 2 < nbytes, b2, 0)
    return ((b0 | (b1 << 8) | (b2 << 16)) >> (pos & 7)) & 0xFFFF


@triton.jit
def _zfp_decode_kernel(in_ptr, out_ptr, dec_ptr, vclass_ptr, n4, nblocks,
                       RATE: tl.constexpr, LANES: tl.constexpr, STATE: tl.constexpr,
                       STEPS: tl.constexpr, BF16: tl.constexpr):
    b = tl.program_id(0) * LANES + tl.arange(0, LANES)
    live = b < nblocks
    bl = tl.where(live, b, 0).to(tl.int64)
    nbytes: tl.constexpr = 2 * RATE
    base = bl * nbytes
    cols = tl.arange(0, 16)
    head = _read16(in_ptr, base, tl.zeros([LANES], dtype=tl.int64), nbytes) & 0x1FF
    flag = (head & 1) == 1
    e = head >> 1
    nonzero = flag & (e > 0)
    nan = flag & (e == 0)
    emax = (e - 127).to(tl.int32)
    maxbits = 16 * RATE
    pos = tl.full([LANES], 9, tl.int64)
    budget = tl.where(nonzero, maxbits - 9, 0).to(tl.int64)
    n = tl.zeros([LANES], dtype=tl.int64)
    u = tl.zeros([LANES, 16], dtype=tl.int32)
    for i in range(32):
        k = 31 - i
        m = tl.minimum(n, budget)
        x = _read16(in_ptr, base, pos, nbytes) & ((tl.full([LANES], 1, tl.int64) << m) - 1)
        pos += m
        budget -= m
        state = n * (3 * STATE)
        for _ in tl.static_range(STEPS):
            byte = _read16(in_ptr, base, pos, nbytes) & 0xFF
            vc = tl.load(vclass_ptr + budget)
            ent = tl.load(dec_ptr + state + vc + byte)
            x |= ent & 0xFFFF
            used = (ent >> 16) & 0xFF
            pos += used
            budget -= used
            state = ent >> 24
        n = state // (3 * STATE)
        u |= (((x[:, None] >> cols[None, :]) & 1) << k).to(tl.int32)
    nbm = -1431655766
    ints = (u ^ nbm) - nbm
    # inverse of PERM: block position PERM[i] gets coefficient i
    p0 = _col(ints, cols, 0)
    p1 = _col(ints, cols, 1)
    p4 = _col(ints, cols, 2)
    p5 = _col(ints, cols, 3)
    p2 = _col(ints, cols, 4)
    p8 = _col(ints, cols, 5)
    p6 = _col(ints, cols, 6)
    p9 = _col(ints, cols, 7)
    p3 = _col(ints, cols, 8)
    p12 = _col(ints, cols, 9)
    p10 = _col(ints, cols, 10)
    p7 = _col(ints, cols, 11)
    p13 = _col(ints, cols, 12)
    p11 = _col(ints, cols, 13)
    p14 = _col(ints, cols, 14)
    p15 = _col(ints, cols, 15)
    # columns (along y), then rows (along x)
    p0, p4, p8, p12 = _inv_lift(p0, p4, p8, p12)
    p1, p5, p9, p13 = _inv_lift(p1, p5, p9, p13)
    p2, p6, p10, p14 = _inv_lift(p2, p6, p10, p14)
    p3, p7, p11, p15 = _inv_lift(p3, p7, p11, p15)
    p0, p1, p2, p3 = _inv_lift(p0, p1, p2, p3)
    p4, p5, p6, p7 = _inv_lift(p4, p5, p6, p7)
    p8, p9, p10, p11 = _inv_lift(p8, p9, p10, p11)
    p12, p13, p14, p15 = _inv_lift(p12, p13, p14, p15)
    ib = tl.zeros([LANES, 16], dtype=tl.int32)
    ib = _put(ib, cols, 0, p0)
    ib = _put(ib, cols, 1, p1)
    ib = _put(ib, cols, 2, p2)
    ib = _put(ib, cols, 3, p3)
    ib = _put(ib, cols, 4, p4)
    ib = _put(ib, cols, 5, p5)
    ib = _put(ib, cols, 6, p6)
    ib = _put(ib, cols, 7, p7)
    ib = _put(ib, cols, 8, p8)
    ib = _put(ib, cols, 9, p9)
    ib = _put(ib, cols, 10, p10)
    ib = _put(ib, cols, 11, p11)
    ib = _put(ib, cols, 12, p12)
    ib = _put(ib, cols, 13, p13)
    ib = _put(ib, cols, 14, p14)
    ib = _put(ib, cols, 15, p15)
    # s = 2^(emax - 30) in fp32: subnormal below 2^-126, 0 below 2^-149 (as ldexpf)
    sexp = emax - 30
    s_norm = ((sexp + 127) << 23).to(tl.float32, bitcast=True)
    s_sub = (1 << tl.minimum(tl.maximum(sexp + 149, 0), 22)).to(tl.float32, bitcast=True)
    s = tl.where(sexp >= -126, s_norm, tl.where(sexp >= -149, s_sub, 0.0))
    v = ib.to(tl.float32) * s[:, None]
    v = tl.where(nonzero[:, None], v, 0.0)
    v = tl.where(nan[:, None], float("nan"), v)
    dst = bl[:, None] * 16 + cols[None, :]
    _store_float(out_ptr, dst, v, live[:, None] & (dst < n4), BF16)


def zfp_decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.decode."""
    n4 = out.numel()
    nblocks = -(-n4 // 16)
    dec = zfp_torch._decode_table(out.device)
    vclass = zfp_torch._budget_class(16 * rate, out.device)
    grid = (triton.cdiv(nblocks, _ZFP_LANES),)
    _zfp_decode_kernel[grid](payload, *_float_out(out), dec, vclass, n4, nblocks, RATE=rate,
                             LANES=_ZFP_LANES, STATE=zfp_torch._STATE, STEPS=zfp_torch._STEPS,
                             BF16=out.dtype == torch.bfloat16, **_EXACT)


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
