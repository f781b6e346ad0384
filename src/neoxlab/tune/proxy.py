"""Stage (a) of the loss guard: what a codec does to a dimension's own messages.

The relative error ||x - x'|| / ||x|| of encoding and decoding, pooled over the tensors the
capture run kept of that dimension (comm/capture.py: the first messages of each dimension,
from every rank, as the engine handed them over). A codec that runs twice on a message
(the compressed all-reduce codes the chunks, then their sum) errs about twice as much; the
budget is set for one coding (tune.error_budget, docs/tune.md). Error feedback does not
change one step's error, only what it adds up to, so it is not a term here.

Where nothing can be captured (tune.measure=false: a cluster this machine cannot run), the
tensors are seeded Gaussian stand-ins, and the report says so.
"""

from __future__ import annotations

import math

import torch

from neoxlab.compress import make_compressor

SYNTHETIC_NUMEL = 1 << 15
SYNTHETIC_TENSORS = 4
PROXY_TENSORS = 8  # a dimension's first captured tensors coded (each codec: seconds on a CPU)


def relative_error(spec: str, tensors: list[torch.Tensor]) -> float | None:
    """sqrt(sum ||x - x'||^2 / sum ||x||^2) over the tensors; None without tensors."""
    if not tensors:
        return None
    codec = make_compressor(spec)
    err = norm = 0.0
    for x in tensors[:PROXY_TENSORS]:
        y = codec.decode(codec.encode(x))
        ref = x.double()
        err += float(torch.sum((y.double() - ref) ** 2))
        norm += float(torch.sum(ref ** 2))
    if norm == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return math.sqrt(err / norm)


def synthetic(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Seeded Gaussian stand-ins for a dimension's messages (no capture possible)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(SYNTHETIC_NUMEL, generator=gen) * 1e-3).to(dtype)
            for _ in range(SYNTHETIC_TENSORS)]


def errors(specs: list[str], by_dim: dict[str, list[torch.Tensor]]
           ) -> dict[tuple[str, str], float | None]:
    """(dim, codec spec) -> relative error, for every dimension with tensors (dimensions
    that share one list of tensors, as the synthetic ones do, are coded once)."""
    done: dict[tuple[int, str], float | None] = {}
    out = {}
    for dim, tensors in by_dim.items():
        for spec in specs:
            key = (id(tensors), spec)
            if key not in done:
                done[key] = 0.0 if spec == "none" else relative_error(spec, tensors)
            out[(dim, spec)] = done[key]
    return out
