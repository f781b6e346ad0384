"""Predicted bytes between nodes per training step: what the uplinks of an emulated cluster
should carry (TCP payload, headers excluded), to set against network.json's counters
(perfmodel.wire.payload_bytes) and against the comm accounting (accounted_between_nodes).

One step's messages are the performance model's (traffic.messages, counted per micro-batch
or per step as predict() counts them), each shrunk by its dimension's codec ratio where
predict() compresses it (predict.codec_for: min_bytes, the MPI library's rules; a ratio <= 1
is sent raw). Every rank of every group of the message's dimension sends it as the comm
accounting counts a call (perfmodel.wire.sent_factor on the op the patch records), and the
placement (node = rank // ranks_per_node, perfmodel.topology) gives the share of a group's
bytes that leaves a node: the share of a ring's hops that join two nodes
(perfmodel.wire.crossing_fraction). Limits: every pipeline stage is priced as the busiest
one (traffic.stage_shape), compressed payloads' headers and sizes are not counted (int8's
fp32 scale per 256-value block adds 1/64 to its payload), and the all-to-all phase of a
compressed all-reduce, which is pairwise, is shared between nodes as a ring would be.
"""

from __future__ import annotations

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.layout import Layout, resolve_layout
from neoxlab.perfmodel import costs, traffic
from neoxlab.perfmodel.predict import codec_for
from neoxlab.perfmodel.topology import groups
from neoxlab.perfmodel.wire import accounted_between_nodes

DIMS = ("tp", "pp", "dp", "zero", "control")


def wire_ratio(cfg: Config, profile: PerfProfile, msg: traffic.Message) -> float:
    """How much smaller predict() puts `msg` on the wire: its codec's ratio where the codec
    takes it, 1 where it goes raw."""
    codec = codec_for(cfg, profile, msg, [])
    if not costs.compresses(msg, codec) or codec.ratio <= 1.0:
        return 1.0
    return codec.ratio


def allreduce_algorithm(allreduce: str, group: int) -> str:
    """The algorithm the compression patch runs a compressed all-reduce of `group` ranks
    with under compression.allreduce (auto: all-gather up to costs.SMALL_GROUP ranks)."""
    if allreduce != "auto":
        return allreduce
    return "allgather" if group <= costs.SMALL_GROUP else "alltoall"


def accounted_call(msg: traffic.Message, ratio: float, allreduce: str
                   ) -> tuple[str, float, int]:
    """One call of `msg` on one rank as the comm accounting records it: (op, bytes_out per
    recorded call, recorded calls). A compressed all-reduce that runs as an all-gather of
    the whole payload (compression.allreduce, auto: up to costs.SMALL_GROUP ranks) sends it
    to every other rank; a reduce to owners is one reduce of a 1/group part per owner."""
    n, nbytes = msg.group, msg.nbytes / ratio
    if msg.op == "all_reduce":
        gathered = ratio > 1.0 and allreduce_algorithm(allreduce, n) == "allgather"
        return ("all_gather" if gathered else "all_reduce"), nbytes, 1
    if msg.op == "all_gather":  # nbytes: the gathered output; each rank sends its part
        return "all_gather", nbytes / n, 1
    if msg.op == "reduce_to_owners":
        return "reduce", nbytes / n, n
    if msg.op == "p2p":
        return "send", nbytes, 1
    if msg.op == "broadcast":  # accounted on every rank, the root's and the others'
        return "broadcast", nbytes, 1
    raise ValueError(f"no wire model for message op '{msg.op}'")


def group_rows(msg: traffic.Message, layout: Layout, ratio: float, allreduce: str
               ) -> list[dict]:
    """One step of `msg` as the comm accounting of each group of its dimension sums it
    (comm_groups.jsonl's rows: ranks, op, bytes_out of all its ranks): every rank of the
    group, its stage's calls (traffic.stage_calls)."""
    op, nbytes, calls = accounted_call(msg, ratio, allreduce)
    micro = layout.grad_accum if msg.per == "microbatch" else 1
    return [{"ranks": group, "op": op,
             "bytes_out": len(group) * nbytes * (traffic.stage_calls(msg, layout, group)
                                                 * calls * micro)}
            for group in groups(layout, msg.dim)]


def uplink_payload_bytes(cfg: Config, profile: PerfProfile, layout: Layout | None = None
                         ) -> dict[str, float]:
    """tp, pp, dp, zero, control and "total" -> TCP payload bytes per training step that all
    ranks together send to other nodes (the uplinks' payload; 0 inside one node).
    `profile` gives the data-dependent codecs' ratios (e.g. mpc), as for predict()."""
    layout = layout or resolve_layout(cfg)
    per_node = max(cfg.cluster.ranks_per_node, 1)
    out = dict.fromkeys(DIMS, 0.0)
    for msg in traffic.messages(cfg, layout):
        rows = group_rows(msg, layout, wire_ratio(cfg, profile, msg), cfg.compression.allreduce)
        out[msg.dim] += accounted_between_nodes(rows, lambda rank: rank // per_node)
    out["total"] = sum(out.values())
    return out
