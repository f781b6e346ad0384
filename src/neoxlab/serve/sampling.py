"""Next-token choice: greedy, or sampling from a per-request generator.

Each request owns its generator (seeded by the request), so a sampled output does not depend
on which other requests share its decode step: every policy gives the same text.
"""

from __future__ import annotations

import torch


def request_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pick(logits: torch.Tensor, mode: str, generator: torch.Generator | None = None,
         temperature: float = 1.0, top_k: int = 0) -> int:
    """One token from one row of logits [vocab]."""
    if mode == "greedy":
        return int(torch.argmax(logits))
    scaled = logits.float().cpu() / temperature
    if top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
