"""Bit-plane transposition of W-bit integer words, shared by MPC and our ZFP coder.

A chunk of W words (W = 16, 32 or 64) is a W x W bit matrix; transposing it turns bit k of
every word into word k, so the leading zero bits of small values become whole zero words
(MPC drops them) and a ZFP block's bit planes become words to code one at a time. Done in
log2(W) butterfly stages of shifts and masks over all chunks at once.
"""

from __future__ import annotations

import torch


def transpose_planes(z: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In-place W x W bit-matrix transpose of every chunk; z is (W, chunks), contiguous,
    column c holding the W words of chunk c. Afterwards bit r of z[k, c] is what was bit k
    of z[r, c]. Stage j swaps the off-diagonal (j x j) blocks: the high-column bits of row
    r with the low-column bits of row r + j. Arithmetic right shifts are harmless: the sign
    copies land in masked-off bits."""
    width, nch = z.shape
    half = width * nch // 2
    if scratch is None or scratch.numel() < half:
        scratch = torch.empty(half, dtype=z.dtype, device=z.device)
    for j, mask in STAGES[width]:
        v = z.view(width // (2 * j), 2, j, nch)
        a, b = v[:, 0], v[:, 1]  # rows with bit j clear / set
        t = scratch[:half].view(width // (2 * j), j, nch)
        torch.bitwise_right_shift(a, j, out=t)
        t.bitwise_xor_(b).bitwise_and_(mask)
        b.bitwise_xor_(t)
        a.bitwise_xor_(t.bitwise_left_shift_(j))
    return z


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


# (j, mask) of every stage, per word width
STAGES = {w: _stages(w) for w in (16, 32, 64)}
