"""One collective of a training step, the unit of the performance model's traffic.

It sits at the bottom so that an engine can state its own traffic (engines/neox/traffic.py:
what GPT-NeoX's pipeline and TP layers send) and the performance model (perfmodel/traffic.py)
can price it without the engine importing the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """`count` calls of one collective of `nbytes` (uncompressed, per rank) over `group`."""

    dim: str  # tp | pp | dp | zero | control
    op: str  # all_reduce | reduce_to_owners | all_gather | p2p | broadcast
    # all_reduce, reduce_to_owners (each 1/group part reduced to its owner, as ZeRO's
    # zero.reduce_to_owner): the buffer; all_gather: the gathered output; p2p: the payload;
    # broadcast: the buffer (accounted on every rank of the group, the root's and the others')
    nbytes: float
    group: int  # ranks in the group (2 for p2p)
    # calls per rank; a p2p's pair accounts each call on both ends (a send and its recv), as
    # the comm accounting does, so `count` p2p calls a micro-batch are `count` payloads
    # crossing each stage boundary in all
    count: float
    per: str  # "microbatch" (on the critical path of every pipeline slot) or "step"
    float_bits: int  # element width, for compression ratios
    # calls per pipeline stage where the stages differ (bytes: each stage's groups issue
    # their own; None: `count` on every stage, each priced as the busiest one); `count` is
    # then the most any one stage issues, what the time model puts on the critical path
    stage_counts: tuple[float, ...] | None = None
    raw: bool = False  # integers (token ids, partition metadata): no codec ever takes them
