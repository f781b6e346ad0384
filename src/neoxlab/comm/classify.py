"""Which parallel dimension a collective belongs to, decided by the ranks it involves.

DeepSpeed's grid and megatron-core build different group objects for the same rank sets, so
group identity is useless; the rank set (and, for p2p, the peer) is what identifies traffic.
Rank layout is pipe-major, then data, then model: rank = p*(dp*tp) + d*tp + m.
"""

from __future__ import annotations

from dataclasses import dataclass

REDUCTIONS = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce"}
GATHERS = {"all_gather", "all_gather_into_tensor"}
P2P = {"send", "recv"}
CONTROL_MAX_NUMEL = 8  # losses, norms, overflow flags: control traffic


@dataclass(frozen=True)
class Grid:
    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, p: int, d: int, m: int) -> int:
        return p * self.dp * self.tp + d * self.tp + m

    def coord(self, rank: int) -> tuple[int, int, int]:
        p, rest = divmod(rank, self.dp * self.tp)
        d, m = divmod(rest, self.tp)
        return p, d, m

    def group_sets(self) -> dict[frozenset[int], str]:
        """Every TP, DP and pipe rank set (singletons excluded), labelled by axis."""
        sets: dict[frozenset[int], str] = {}
        for p in range(self.pp):
            for d in range(self.dp):
                sets.setdefault(frozenset(self.rank(p, d, m) for m in range(self.tp)), "tp")
            for m in range(self.tp):
                sets.setdefault(frozenset(self.rank(p, d, m) for d in range(self.dp)), "dp")
        for d in range(self.dp):
            for m in range(self.tp):
                sets.setdefault(frozenset(self.rank(p, d, m) for p in range(self.pp)), "pipe")
        return {ranks: axis for ranks, axis in sets.items() if len(ranks) > 1}


class Classifier:
    """`tokens`: tokens of one micro-batch (micro_batch * seq_length), which identify the
    cross-entropy statistics whatever their shape; `hidden_size`: the fallback when the
    token count is not known."""

    def __init__(self, grid: Grid, hidden_size: int | None = None, tokens: int | None = None):
        self.grid = grid
        self.sets = grid.group_sets()
        self.hidden_size = hidden_size
        self.tokens = tokens

    def collective(self, op: str, ranks: frozenset[int], numel: int,
                   shape: tuple[int, ...] = ()) -> str:
        if numel <= CONTROL_MAX_NUMEL:
            return "other"
        axis = self.sets.get(ranks)
        if axis == "tp":
            return "other" if self.is_loss_statistic(op, numel, shape) else "tp"
        if axis == "dp":
            if op in REDUCTIONS:
                return "dp"
            if op in GATHERS:
                return "zero"
        return "other"

    def is_loss_statistic(self, op: str, numel: int, shape: tuple[int, ...]) -> bool:
        """Vocab-parallel cross-entropy all-reduces per-token fp32 statistics (max logit,
        sum of exponentials, target logit): one value per token of the micro-batch, control
        values that must stay exact. Every TP activation or gradient reduction carries
        hidden-size values per token, never one, so with the token count known the rule is
        numel == tokens, whatever the shape ([s, b] with b == hidden is a statistic, not an
        activation). Without it: a 2-D tensor that does not end in the hidden dimension."""
        if op not in REDUCTIONS:
            return False
        if self.tokens is not None:
            return numel == self.tokens
        return (self.hidden_size is not None and len(shape) == 2
                and shape[-1] != self.hidden_size)

    def p2p(self, me: int, peer: int, numel: int) -> str:
        """Adjacent pipeline stages with the same data/model coordinate exchange activations."""
        if numel <= CONTROL_MAX_NUMEL:
            return "other"
        (p1, d1, m1), (p2, d2, m2) = self.grid.coord(me), self.grid.coord(peer)
        if (d1, m1) == (d2, m2) and abs(p1 - p2) in (1, self.grid.pp - 1):
            return "pp"
        return "other"
