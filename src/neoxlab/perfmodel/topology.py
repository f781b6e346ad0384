"""Which link a parallel group crosses, from the rank layout and the ranks per node.

Ranks are pipe-major, then data, then model (rank = p*dp*tp + d*tp + m, TP ranks
contiguous), as in DeepSpeed's PipeModelDataParallelTopology and megatron-core; node =
rank // ranks_per_node. A dimension is inter-node when any of its groups spans two nodes:
the slowest group sets the pace of a synchronous step.
"""

from __future__ import annotations

from neoxlab.layout import Layout


def _rank(layout: Layout, p: int, d: int, m: int) -> int:
    return p * layout.dp * layout.tp + d * layout.tp + m


def groups(layout: Layout, dim: str) -> list[list[int]]:
    """Every group of `dim` (tp, dp/zero, pp stage pairs, control: the world) as rank lists."""
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    if dim == "tp":
        return [[_rank(layout, p, d, m) for m in range(tp)] for p in range(pp) for d in range(dp)]
    if dim in ("dp", "zero"):
        return [[_rank(layout, p, d, m) for d in range(dp)] for p in range(pp) for m in range(tp)]
    if dim == "control":
        return [list(range(layout.world_size))]
    if dim == "pp":
        return [[_rank(layout, p, d, m), _rank(layout, p + 1, d, m)]
                for p in range(pp - 1) for d in range(dp) for m in range(tp)]
    raise ValueError(f"unknown dimension {dim!r}")


def crosses_nodes(layout: Layout, dim: str, ranks_per_node: int) -> bool:
    return any(len({r // ranks_per_node for r in g}) > 1 for g in groups(layout, dim))
