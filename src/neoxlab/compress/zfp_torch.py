"""ZFP fixed-rate coding of fp32 4x4 blocks with torch tensor ops (any device, no host sync).

Written from the ZFP papers and the structure of LLNL/zfp 1.0.1 (src/template/encode.c,
decode.c, codecf.c), producing the same bits as zfpy for 2-D float arrays in fixed-rate
mode. Per block of 16 values, all blocks at once:

1. block-floating-point: emax = frexp exponent of max|x| (at least -126); ints =
   trunc(x * 2^(30 - emax)) with the scale and product in fp32, as ZFP computes them
   (an fp32 overflow of the scale for tiny blocks gives INT_MIN, as x86 does).
2. ZFP's decorrelating lifting transform along rows, then columns (int32, wrapping).
3. reorder by sequency (PERM) and map to negabinary: u = (i + 0xaaaaaaaa) ^ 0xaaaaaaaa.
4. bit planes 31..0 of the 16 values (a 32x32 bit-matrix transpose per block); the
   embedded coder writes each plane as its first n bits verbatim (n = values already
   significant) then group tests. A plane's code depends only on (plane, n), so a table
   of 65536 x 17 codes turns each plane into a gather; n is the running max of the
   planes' bit lengths. Codes are concatenated per block after the 9-bit block header
   (1 = non-zero block, 8-bit biased exponent), truncated at 16 * rate bits (exclusive
   cumulative sums of lengths give offsets) and OR-ed into 64-bit words.

Decoding runs the planes in order with a byte-at-a-time state machine table (state: n,
group-test or scanning, the byte, how many of its bits are left in the budget), 4 steps
per plane, which covers the longest group-test code (31 bits); ZFP's rule for a code cut
by the budget (a cut scan sets the bit it was looking at) is part of the table.

Blocks holding NaN/Inf are written as header 1 + exponent 0 (ZFP never writes exponent
0) and decode as NaN. Work is done in chunks of ``CHUNK_BLOCKS`` blocks to bound memory
(fp16/bf16 input is upcast a chunk at a time too).
Little-endian byte order is assumed (x86, ARM, CUDA).
"""

from __future__ import annotations

import torch

from neoxlab.compress.bitplanes import transpose_planes

# blocks per chunk of work: on CPU small enough for the temporaries to stay in cache
# (4096 measured fastest of 1024..65536); on an accelerator as large as the codec scratch
# budget allows (comm_scratch.CODEC_SCRATCH_BYTES, 128 MiB): a chunk's temporaries peak at
# about 3.5 KiB a block (encode; decode about a fifth; measured on CPU with these chunks),
# so 2^15 blocks (512 Ki values) hold ~115 MiB, where 2^18 held ~0.9 GB
CHUNK_BLOCKS = {"cpu": 1 << 12}
CHUNK_BLOCKS_DEVICE = 1 << 15
_EBIAS = 127
_NB = -0x55555556  # 0xaaaaaaaa as int32
_INT_MIN = -(1 << 31)
# coefficient order by sequency: index (i, j) = i + 4 j, sorted by i + j then i^2 + j^2
PERM = (0, 1, 4, 5, 2, 8, 6, 9, 3, 12, 10, 7, 13, 11, 14, 15)
_STEPS = 4  # 8-bit decode steps per plane: a group-test code is <= 31 bits (all ones)

_CACHE: dict[tuple[str, torch.device], torch.Tensor] = {}


# -- tables ---------------------------------------------------------------------------------

def _encode_table(device: torch.device) -> torch.Tensor:
    """int64[17 * 65536]: index n * 65536 + plane -> code bits | length << 40.

    The code is the plane's first n bits verbatim, then for each further one-bit at
    position p (scanning from c, the first value not yet coded) a positive group test and
    the scan up to it: "1", p - c zeros, "1" (for p = 15 the final one is implied: "1" and
    15 - c zeros), and a closing negative group test "0" unless the scan reached 16."""
    key = ("enc", device)
    if key not in _CACHE:
        x = torch.arange(1 << 16, dtype=torch.int64).repeat(17)
        n = torch.arange(17, dtype=torch.int64).repeat_interleave(1 << 16)
        code = x & ((1 << n) - 1)
        length = n.clone()
        c = n.clone()
        for p in range(16):
            one = (p >= n) & (((x >> p) & 1) == 1)
            tok_len = p - c + 2 if p < 15 else 16 - c
            tok = 1 | (1 << (p - c + 1)) if p < 15 else torch.ones_like(c)
            code |= torch.where(one, tok << length, 0)
            length += torch.where(one, tok_len, 0)
            c = torch.where(one, p + 1, c)
        length += (c < 16).long()  # the closing "0"
        _CACHE[key] = (code | length << 40).to(device)
    return _CACHE[key]


def _bitlen_table(device: torch.device) -> torch.Tensor:
    key = ("bitlen", device)
    if key not in _CACHE:
        v = torch.arange(1 << 16, dtype=torch.float64)
        bl = torch.where(v > 0, torch.floor(torch.log2(v.clamp(min=1))) + 1, 0)
        _CACHE[key] = bl.to(torch.int64).to(device)
    return _CACHE[key]


_VF = 18  # budget classes per decode state: v = 0..8 usable bits, final or not
_STATE = _VF * 256  # table rows per decode state


def _decode_table(device: torch.device) -> torch.Tensor:
    """int64[51 * 18 * 256]: row of state s = 3 n + phase (phase 0: next bit is a group
    test, 1: scanning for a one, 2: plane done), budget class v + 9 * final (v = budget
    bits usable in this byte, 0-8; final = the budget ends with them), byte ->
    set-bits mask | bits consumed << 16 | row base of the next state << 24."""
    key = ("dec", device)
    if key not in _CACHE:
        idx = torch.arange(51 * _STATE, dtype=torch.int64)
        byte = idx % 256
        vf = idx // 256 % _VF
        state = idx // _STATE
        n, phase = state // 3, state % 3
        v, final = vf % 9, vf >= 9
        mask = torch.zeros_like(idx)
        used = torch.zeros_like(idx)
        done = (phase == 2) | (n >= 16)
        phase = phase.clamp(max=1)
        for _ in range(8):
            live = ~done & (used < v)
            bit = (byte >> used) & 1
            used = used + live.long()
            test = live & (phase == 0)
            scan = live & (phase == 1)
            # group test: 0 ends the plane; 1 at n = 15 means value 15 is the one
            last = test & (bit == 1) & (n == 15)
            mask |= torch.where(last, 1 << 15, 0)
            done = done | (test & (bit == 0)) | last
            n = torch.where(last, 16, n)
            phase = torch.where(test & (bit == 1) & (n < 15), 1, phase)
            # scan: a one marks value n; reaching 15 without one implies value 15
            hit = scan & (bit == 1)
            mask |= torch.where(hit, 1 << n.clamp(max=15), 0)
            implied = scan & (bit == 0) & (n == 14)
            mask |= torch.where(implied, 1 << 15, 0)
            n = torch.where(scan, n + 1, n)
            n = torch.where(implied, 16, n)
            done = done | implied
            phase = torch.where(hit, 0, phase)
        # budget exhausted inside a scan (or right after a positive group test): ZFP
        # still deposits the value it was looking at
        cut = final & ~done & (phase == 1)
        mask |= torch.where(cut, 1 << n.clamp(max=15), 0)
        done = done | final | (n >= 16)
        nxt = 3 * n + torch.where(done, 2, phase)
        table = mask | used << 16 | (nxt * _STATE) << 24
        _CACHE[key] = table.to(device)
    return _CACHE[key]


def _budget_class(maxbits: int, device: torch.device) -> torch.Tensor:
    """int64[maxbits + 1]: remaining budget -> its decode-table offset (v + 9 final) * 256."""
    key = (f"vf{maxbits}", device)
    if key not in _CACHE:
        b = torch.arange(maxbits + 1, dtype=torch.int64)
        _CACHE[key] = ((b.clamp(max=8) + 9 * (b <= 8).long()) * 256).to(device)
    return _CACHE[key]


# -- block transforms -------------------------------------------------------------------------

def _fwd_lift(p: torch.Tensor, dim: int) -> None:
    x, y, z, w = (p.select(dim, i).clone() for i in range(4))
    x += w; x >>= 1; w -= x  # noqa: E702
    z += y; z >>= 1; y -= z  # noqa: E702
    x += z; x >>= 1; z -= x  # noqa: E702
    w += y; w >>= 1; y -= w  # noqa: E702
    w += y >> 1; y -= w >> 1  # noqa: E702
    for i, v in enumerate((x, y, z, w)):
        p.select(dim, i).copy_(v)


def _inv_lift(p: torch.Tensor, dim: int) -> None:
    x, y, z, w = (p.select(dim, i).clone() for i in range(4))
    y += w >> 1; w -= y >> 1  # noqa: E702
    y += w; w <<= 1; w -= y  # noqa: E702
    z += x; x <<= 1; x -= z  # noqa: E702
    y += z; z <<= 1; z -= y  # noqa: E702
    w += x; x <<= 1; x -= w  # noqa: E702
    for i, v in enumerate((x, y, z, w)):
        p.select(dim, i).copy_(v)


def _blocks(vals: torch.Tensor) -> torch.Tensor:
    """(n4,) values (n4 % 4 == 0) -> (nblocks, 16) fp32 with ZFP's padding of a last block
    of 1-3 rows (rows repeat as 0,0,0,0 / 0,1,1,0 / 0,1,2,0)."""
    rows = vals.numel() // 4
    full = rows // 4
    v = vals.float()
    if rows % 4 == 0:
        return v.view(full, 16)
    last = v[full * 16:].view(rows % 4, 4)
    order = {1: [0, 0, 0, 0], 2: [0, 1, 1, 0], 3: [0, 1, 2, 0]}[rows % 4]
    pad = last[order].reshape(1, 16)
    return torch.cat([v[: full * 16].view(full, 16), pad])


def _chunk(device: torch.device) -> int:
    return CHUNK_BLOCKS.get(device.type, CHUNK_BLOCKS_DEVICE)


def _pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """2^e rounded to fp32 as ldexpf does: inf above 2^127, subnormal or 0 below 2^-126."""
    return torch.ldexp(torch.ones(e.shape, dtype=torch.float64, device=e.device),
                       e.to(torch.float64)).float()


def _perm(device: torch.device) -> torch.Tensor:
    key = ("perm", device)
    if key not in _CACHE:
        _CACHE[key] = torch.tensor(PERM, dtype=torch.int64, device=device)
    return _CACHE[key]


# -- encode -------------------------------------------------------------------------------------

def encode(vals: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """ZFP fixed-rate stream of the flat values (numel % 4 == 0, as (n/4, 4)) into the
    uint8 out of 2 * rate bytes per block of 16."""
    nb = -(-vals.numel() // 16)
    dst = out.view(nb, 2 * rate)
    step = _chunk(vals.device)
    for b0 in range(0, nb, step):
        chunk = _blocks(vals[b0 * 16: (b0 + step) * 16])  # fp16/bf16 upcast a chunk at a time
        dst[b0: b0 + chunk.shape[0]].copy_(_encode_chunk(chunk, rate))


def _encode_chunk(fb: torch.Tensor, rate: int) -> torch.Tensor:
    dev = fb.device
    nb = fb.shape[0]
    amax = fb.abs().amax(1)
    finite = torch.isfinite(amax)
    _, e = torch.frexp(torch.where(finite, amax, 0.0))
    emax = e.clamp(min=1 - _EBIAS)
    nonzero = finite & (amax > 0)
    # s = 2^(30 - emax) in fp32: overflows to inf for emax < -97 (as ldexpf does)
    s = _pow2_f32(30 - emax)
    prod = fb * s[:, None]
    prod = torch.where(finite[:, None] & (prod.abs() < 2.0**31), prod, float(_INT_MIN))
    ib = prod.to(torch.int32).view(nb, 4, 4)  # [block, row y, column x]
    for y in range(4):
        _fwd_lift(ib[:, y, :], 1)
    for x in range(4):
        _fwd_lift(ib[:, :, x], 1)
    u = ib.view(nb, 16).index_select(1, _perm(dev))
    u = (u + _NB) ^ _NB  # negabinary (int32 wraps like uint32)
    planes = torch.zeros(32, nb, dtype=torch.int32, device=dev)
    planes[:16] = u.t()
    transpose_planes(planes)  # planes[k, b] = bit k of the 16 values of block b
    x = planes.flip(0).t().contiguous()  # (nb, 32) int32, plane 31 first
    # n before plane k = values already significant = bit length of the OR of the planes
    # above it (an exclusive prefix OR, in log2(32) shifted ORs)
    above = torch.zeros_like(x)
    above[:, 1:] = x[:, :-1]
    step = 1
    while step < 32:
        above[:, step:] |= above[:, :-step].clone()
        step *= 2
    n = _bitlen_table(dev)[above.long()]
    ent = _encode_table(dev)[n * 65536 + x]
    code, length = ent & ((1 << 40) - 1), ent >> 40
    maxbits = 16 * rate
    off = torch.cumsum(length, 1) - length + 9
    keep = (maxbits - off).clamp(min=0).minimum(length)
    code = torch.where(nonzero[:, None], code & ((1 << keep) - 1), 0)
    nwords = (maxbits + 63) // 64 + 1
    word = (off >> 6).clamp(max=nwords - 2)
    sh = off & 63
    lo = code << sh
    hi = (code >> 1) >> (63 - sh)
    words = torch.zeros(nb, nwords, dtype=torch.int64, device=dev)
    words.scatter_add_(1, word, lo)
    words.scatter_add_(1, word + 1, hi)
    head = torch.where(nonzero, 1 + 2 * (emax.long() + _EBIAS), 0)
    head = torch.where(finite, head, 1)  # NaN/Inf: exponent 0 marks the block
    words[:, 0] |= head
    return words.view(torch.uint8)[:, : 2 * rate]


# -- decode -------------------------------------------------------------------------------------

def decode(payload: torch.Tensor, rate: int, out: torch.Tensor) -> None:
    """Inverse of encode: fill the flat out (n4 values, any float dtype) from the stream."""
    n4 = out.numel()
    nb = -(-n4 // 16)
    src = payload[: 2 * rate * nb].view(nb, 2 * rate)
    step = _chunk(payload.device)
    for b0 in range(0, nb, step):
        chunk = src[b0: b0 + step]
        vals = _decode_chunk(chunk, rate).reshape(-1)
        lo = b0 * 16
        m = min(vals.numel(), n4 - lo)
        out[lo: lo + m].copy_(vals[:m])


def marked_blocks(payload: torch.Tensor, rate: int) -> torch.Tensor:
    """bool per block: written as NaN/Inf (header bit 1, exponent 0)."""
    blocks = payload.view(-1, 2 * rate).long()
    return (blocks[:, 0] == 1) & ((blocks[:, 1] & 1) == 0)


def _decode_chunk(src: torch.Tensor, rate: int) -> torch.Tensor:
    dev = src.device
    nb = src.shape[0]
    nbytes = 2 * rate
    raw = torch.zeros(nb, nbytes + 3, dtype=torch.int64, device=dev)
    raw[:, :nbytes] = src
    # win[:, j] = the 24 bits starting at byte j (any read of <= 16 bits at a bit offset)
    win = raw[:, :nbytes] | raw[:, 1: nbytes + 1] << 8 | raw[:, 2: nbytes + 2] << 16
    head = win[:, 0] & 0x1FF
    flag = (head & 1) == 1
    e = head >> 1
    nonzero = flag & (e > 0)
    nan = flag & (e == 0)
    emax = e - _EBIAS
    table = _decode_table(dev)
    maxbits = 16 * rate
    vclass = _budget_class(maxbits, dev)
    last_byte = nbytes - 1

    def read(pos: torch.Tensor) -> torch.Tensor:
        """the 16 bits at bit offset pos of each block (LSB first; zeros past the end)."""
        at = (pos >> 3).clamp(max=last_byte)
        return win.gather(1, at[:, None])[:, 0] >> (pos & 7)

    pos = torch.full((nb,), 9, dtype=torch.int64, device=dev)
    budget = torch.where(nonzero, maxbits - 9, 0)
    n = torch.zeros(nb, dtype=torch.int64, device=dev)
    planes = torch.empty(32, nb, dtype=torch.int32, device=dev)
    for k in range(32):  # plane 31 - k
        m = n.minimum(budget)
        x = read(pos) & ((1 << m) - 1)
        pos += m
        budget -= m
        state = n * (3 * _STATE)  # phase 0
        for _ in range(_STEPS):
            ent = table[state + vclass[budget] + (read(pos) & 0xFF)]
            x |= ent & 0xFFFF
            used = (ent >> 16) & 0xFF
            pos += used
            budget -= used
            state = ent >> 24
        n = state // (3 * _STATE)
        planes[k] = x
    planes = planes.flip(0).contiguous()
    transpose_planes(planes)  # planes[i, b] = value i (negabinary) of block b
    u = planes[:16].t()
    ints = (u ^ _NB) - _NB
    ib = torch.empty(nb, 16, dtype=torch.int32, device=dev)
    ib[:, _perm(dev)] = ints
    ib = ib.view(nb, 4, 4)
    for x_ in range(4):
        _inv_lift(ib[:, :, x_], 1)
    for y in range(4):
        _inv_lift(ib[:, y, :], 1)
    s = _pow2_f32(emax - 30)
    vals = ib.view(nb, 16).float() * s[:, None]
    vals = torch.where(nonzero[:, None], vals, 0.0)
    return torch.where(nan[:, None], float("nan"), vals)
