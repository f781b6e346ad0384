"""Byte-level text that exists on every machine, with a deterministic split and order.

The default corpus is the Python standard library's own sources (no download); a user
text file or directory works the same way. Token ids are bytes, so the vocabulary is 256.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from neoxlab.config import DataConfig


def corpus_files(cfg: DataConfig) -> list[Path]:
    if cfg.source == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return sorted(p for p in root.glob("*.py") if p.is_file())
    path = Path(str(cfg.path)).expanduser()
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    if not path.is_file():
        raise FileNotFoundError(f"data.path={path} does not exist; give a text file or folder")
    return [path]


def load_bytes(cfg: DataConfig) -> torch.Tensor:
    """Up to max_bytes of the corpus as uint8, files in sorted order for reproducibility."""
    chunks, total = [], 0
    for path in corpus_files(cfg):
        data = path.read_bytes()[: cfg.max_bytes - total]
        chunks.append(data)
        total += len(data)
        if total >= cfg.max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


class TokenWindows:
    """Non-overlapping windows of seq+1 bytes, shuffled once by seed; train/val split."""

    def __init__(self, cfg: DataConfig, seq_length: int, split: str = "train"):
        data = load_bytes(cfg).long()
        n_windows = (data.numel() - 1) // seq_length
        if n_windows < 2:
            raise ValueError(
                f"corpus has {data.numel()} bytes, fewer than two windows of seq_length "
                f"{seq_length}; use a larger data.max_bytes or corpus"
            )
        starts = torch.arange(n_windows) * seq_length
        order = torch.randperm(n_windows, generator=torch.Generator().manual_seed(cfg.seed))
        n_val = max(1, int(n_windows * cfg.val_fraction))
        chosen = order[n_val:] if split == "train" else order[:n_val]
        self.data, self.starts, self.seq = data, starts[chosen], seq_length

    def __len__(self) -> int:
        return self.starts.numel()

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[index % len(self)])
        window = self.data[start : start + self.seq + 1]
        return window[:-1], window[1:]

    def batch(self, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.sample(i) for i in indices]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def micro_batches(
    windows: TokenWindows, step: int, global_batch: int, dp_rank: int, micro: int, accum: int
):
    """The micro-batches one DP rank feeds in one step: its slice of the global batch."""
    base = step * global_batch + dp_rank * micro * accum
    for k in range(accum):
        yield windows.batch(range(base + k * micro, base + (k + 1) * micro))
