"""Preallocated per-slot KV cache: every slot holds max_seq_len positions of every layer.

One tensor per K and V ([layers, slots, heads, max_seq_len, head_dim]) so that moving a
request between slots (buffer reordering) is two copies, whatever the layer count.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self, layers: int, slots: int, heads: int, max_seq_len: int, head_dim: int,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ):
        shape = (layers, slots, heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    def move(self, src: int, dst: int) -> None:
        """Copy slot src's cache into slot dst (reordering); src's content is left stale."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])

    def slot_content(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of one slot's first `length` positions (for tests and inspection)."""
        return self.k[:, slot, :, :length].clone(), self.v[:, slot, :, :length].clone()

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
