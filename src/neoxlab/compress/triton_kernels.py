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

_ZFP_LANES = 64  # ZFP blocks per program
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
def _zfp_blocks(pid, rows, LANES: tl.constexpr):
    """The ZFP blocks of program `pid` (one per lane) and the source index of each of their
    16 values: row-major rows of 4 values, 4 rows a block. ZFP pads a last block of
    nr < 4 rows with rows 0,0,0,0 / 0,1,1,0 / 0,1,2,0. In 64 bits: a message of 2^31
    values or more would wrap a 32-bit index (decode and int8/int4 are 64-bit too)."""
    b = pid.to(tl.int64) * LANES + tl.arange(0, LANES)
    cols = tl.arange(0, 16)
    nr = tl.minimum(rows - 4 * b, 4)
    y = cols[None, :] // 4
    nr2 = nr[:, None]
    ry = tl.where(y < nr2, y, tl.where(y == 3, 0, tl.where(nr2 == 2, 1, 0)))
    src = (4 * b[:, None] + ry) * 4 + cols[None, :] % 4
    return b, src


@triton.jit
def _zfp_encode_kernel(x_ptr, out_ptr, enc_ptr, bitlen_ptr, rows, nblocks,
                       RATE: tl.constexpr, LANES: tl.constexpr, NBYTES_P2: tl.constexpr):
    b, src = _zfp_blocks(tl.program_id(0), rows, LANES)
    live = b < nblocks
    cols = tl.arange(0, 16)
    f = tl.load(x_ptr + src, mask=live[:, None], other=0.0).to(tl.float32)
    a = tl.abs(f)
    bad = tl.max(tl.where((f != f) | (a == float("inf")), 1, 0), axis=1) > 0
    amax = tl.max(tl.where(bad[:, None], 0.0, a), axis=1)
    expo = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    emax = tl.maximum(expo - 126, -126)
    nonzero = (amax > 0) & (~bad)
    e2 = 157 - emax  # biased exponent of 2^(30 - emax); >= 255 overflows to inf
    s = tl.where(e2 >= 255, 0x7F800000, e2 << 23).to(tl.float32, bitcast=True)
    prod = f * s[:, None]
    prod = tl.where(tl.abs(prod) < 2147483648.0, prod, -2147483648.0)
    ib = prod.to(tl.int32)
    p0 = _col(ib, cols, 0)
    p1 = _col(ib, cols, 1)
    p2 = _col(ib, cols, 2)
    p3 = _col(ib, cols, 3)
    p4 = _col(ib, cols, 4)
    p5 = _col(ib, cols, 5)
    p6 = _col(ib, cols, 6)
    p7 = _col(ib, cols, 7)
    p8 = _col(ib, cols, 8)
    p9 = _col(ib, cols, 9)
    p10 = _col(ib, cols, 10)
    p11 = _col(ib, cols, 11)
    p12 = _col(ib, cols, 12)
    p13 = _col(ib, cols, 13)
    p14 = _col(ib, cols, 14)
    p15 = _col(ib, cols, 15)
    # rows (along x), then columns (along y)
    p0, p1, p2, p3 = _fwd_lift(p0, p1, p2, p3)
    p4, p5, p6, p7 = _fwd_lift(p4, p5, p6, p7)
    p8, p9, p10, p11 = _fwd_lift(p8, p9, p10, p11)
    p12, p13, p14, p15 = _fwd_lift(p12, p13, p14, p15)
    p0, p4, p8, p12 = _fwd_lift(p0, p4, p8, p12)
    p1, p5, p9, p13 = _fwd_lift(p1, p5, p9, p13)
    p2, p6, p10, p14 = _fwd_lift(p2, p6, p10, p14)
    p3, p7, p11, p15 = _fwd_lift(p3, p7, p11, p15)
    # sequency order PERM = (0, 1, 4, 5, 2, 8, 6, 9, 3, 12, 10, 7, 13, 11, 14, 15)
    u = tl.zeros([LANES, 16], dtype=tl.int32)
    u = _put(u, cols, 0, p0)
    u = _put(u, cols, 1, p1)
    u = _put(u, cols, 2, p4)
    u = _put(u, cols, 3, p5)
    u = _put(u, cols, 4, p2)
    u = _put(u, cols, 5, p8)
    u = _put(u, cols, 6, p6)
    u = _put(u, cols, 7, p9)
    u = _put(u, cols, 8, p3)
    u = _put(u, cols, 9, p12)
    u = _put(u, cols, 10, p10)
    u = _put(u, cols, 11, p7)
    u = _put(u, cols, 12, p13)
    u = _put(u, cols, 13, p11)
    u = _put(u, cols, 14, p14)
    u = _put(u, cols, 15, p15)
    nbm = -1431655766  # 0xaaaaaaaa as int32
    u = (u + nbm) ^ nbm
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
        xk = tl.sum(((u >> k) & 1) << cols[None, :], axis=1)
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
    bcols = tl.arange(0, NBYTES_P2)[None, :]
    wi = bcols // 8
    wsel = tl.where(wi == 0, w0[:, None], tl.where(wi == 1, w1[:, None], tl.where(
        wi == 2, w2[:, None], tl.where(wi == 3, w3[:, None], tl.where(
            wi == 4, w4[:, None], tl.where(wi == 5, w5[:, None], tl.where(
                wi == 6, w6[:, None], w7[:, None])))))))
    byte = ((wsel >> ((bcols % 8) * 8)) & 255).to(tl.uint8)
    tl.store(out_ptr + b[:, None] * (2 * RATE) + bcols, byte,
             mask=live[:, None] & (bcols < 2 * RATE))


def zfp_encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Same contract as zfp_torch.encode."""
    rows = vals.numel() // 4
    nblocks = -(-rows // 4)
    enc = zfp_torch._encode_table(vals.device)
    bitlen = zfp_torch._bitlen_table(vals.device)
    grid = (triton.cdiv(nblocks, _ZFP_LANES),)
    _zfp_encode_kernel[grid](vals, out, enc, bitlen, rows, nblocks, RATE=rate,
                             LANES=_ZFP_LANES, NBYTES_P2=triton.next_power_of_2(2 * rate),
                             **_EXACT)


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
