"""Block views shared by the per-block codecs (int8/int4, fp8): each block of ``blk``
consecutive values is one row, so a block's maximum or scale is one reduction over dim 1."""

from __future__ import annotations

import torch


def block_rows(v: torch.Tensor, blk: int) -> list[torch.Tensor]:
    """A flat slice as 2-D views of whole blocks: (full, blk) and, if ragged, (1, rest)."""
    full = v.numel() // blk
    parts = [v[: full * blk].view(full, blk)] if full else []
    if v.numel() > full * blk:
        parts.append(v[full * blk:].view(1, -1))
    return parts
