"""Tensors of a run's own collectives, kept for the tuner's proxy (tune/proxy.py): the first
`limit` messages of each parallel dimension that a codec would see (float sums, gathers and
sends over a group of 2 or more, at least min_bytes), copied to the host as the engine
handed them over, before any codec touched them. Off unless tune.capture_tensors > 0.

    <run_dir>/capture/rank<R>.pt: {dim: [{"op": name, "tensor": 1-D tensor}, ...]}
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from neoxlab.files import write_atomic

CAPTURED_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                "reduce", "send")  # recv buffers and broadcast targets hold no message yet
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
CAPTURE_DIR = "capture"


class Capture:
    def __init__(self, limit: int, max_numel: int, min_bytes: int) -> None:
        self.limit, self.max_numel, self.min_bytes = limit, max_numel, min_bytes
        self.kept: dict[str, list[dict]] = {}

    def offer(self, dim: str, op: str, tensor: torch.Tensor | None) -> None:
        """Keep a copy of the message when its dimension still wants one."""
        if (tensor is None or op not in CAPTURED_OPS or tensor.dtype not in FLOATS
                or tensor.numel() * tensor.element_size() < self.min_bytes):
            return
        kept = self.kept.setdefault(dim, [])
        if len(kept) < self.limit:
            flat = tensor.detach().reshape(-1)[: self.max_numel]
            kept.append({"op": op, "tensor": flat.to("cpu", copy=True)})

    def save(self, run_dir: Path, rank: int) -> Path:
        buffer = io.BytesIO()
        torch.save(self.kept, buffer)
        path = run_dir / CAPTURE_DIR / f"rank{rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, buffer.getvalue())
        return path


def load(run_dir: Path) -> dict[str, list[torch.Tensor]]:
    """Every rank's captured tensors, by dimension."""
    out: dict[str, list[torch.Tensor]] = {}
    for path in sorted((run_dir / CAPTURE_DIR).glob("rank*.pt")):
        for dim, items in torch.load(path, map_location="cpu", weights_only=True).items():
            out.setdefault(dim, []).extend(item["tensor"] for item in items)
    return out
