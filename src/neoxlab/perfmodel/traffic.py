"""What one training step sends: messages per dimension from the model shape and layout.

Counts follow the builtin engine (megatron-core TP layers in a DeepSpeed pipeline) and were
checked against the comm accounting of real runs (tests/unit/test_perfmodel.py):

- TP, per transformer layer and micro-batch: the forward all-reduces after the row-parallel
  attention and MLP outputs (2; GPT-NeoX with parallel residual reduces their sum once: 1),
  the same again when activation checkpointing recomputes the forward, and 2 in backward
  (the inputs of the column-parallel QKV and MLP projections). megatron-core issues the
  backward ones with async_op=True, which neoxlab.comm's patch passes uncompressed (the
  builtin engine with compression.backend=framework; GPT-NeoX's own layers reduce
  synchronously and MPI-level compression sees every call). The last stage adds the LM
  head's backward all-reduce and 3 small all-reduces of vocab-parallel cross entropy; the
  first stage the embedding's forward all-reduce. With TP and PP, stage boundaries carry
  1/tp of an activation and the receiving stage all-gathers it over TP (2 per micro-batch).
- PP, per micro-batch on the critical path: the activation forward and its gradient back.
- DP: one all-reduce of the stage's gradients per step (DeepSpeed's ZeRO-1 reduces buckets
  with all-reduce), then with ZeRO >= 1 an all-gather of the updated parameters.
- control: a few scalar all-reduces per step (loss, overflow check, gradient norm; about 3
  per rank in the accounting of local runs), latency only, never compressed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neoxlab.config import Config
from neoxlab.engines.registry import engine_of
from neoxlab.layout import Layout, estimate_memory

HALF = ("fp16", "bf16")
CE_ALLREDUCES = 3  # max logit, target logit, sum of exponentials (fp32, one per token)
CONTROL_ALLREDUCES = 3  # per step: loss, overflow check, gradient norm (scalars)


@dataclass(frozen=True)
class Message:
    """`count` calls of one collective of `nbytes` (uncompressed, per rank) over `group`."""

    dim: str  # tp | pp | dp | zero | control
    op: str  # all_reduce | reduce_to_owners | all_gather | p2p
    # all_reduce, reduce_to_owners (each 1/group part reduced to its owner, as ZeRO's
    # zero.reduce_to_owner): the buffer; all_gather: the gathered output; p2p: the payload
    nbytes: float
    group: int  # ranks in the group (2 for p2p)
    count: float
    per: str  # "microbatch" (on the critical path of every pipeline slot) or "step"
    float_bits: int  # element width, for compression ratios


@dataclass(frozen=True)
class Shape:
    """Per-rank sizes of the busiest pipeline stage."""

    layers: int  # transformer layers on the stage
    stage_layers: tuple[int, ...]  # layers of every stage (DeepSpeed balances their count)
    activation_bytes: float  # one [micro_batch, seq, hidden] tensor
    stage_params: int  # parameters one rank holds (stage / tp)
    act_bits: int
    grad_bits: int


def stage_shape(cfg: Config, layout: Layout) -> Shape:
    half = cfg.train.precision in HALF
    bits = 16 if half else 32
    m = cfg.model
    act = layout.micro_batch * m.seq_length * m.hidden_size * bits / 8
    params = estimate_memory(cfg, layout).params_per_device
    base, extra = divmod(m.num_layers, layout.pp)
    stages = tuple(base + (1 if s < extra else 0) for s in range(layout.pp))
    return Shape(math.ceil(m.num_layers / layout.pp), stages, act, params, bits, bits)


def forward_allreduces_per_layer(cfg: Config) -> int:
    """GPT-NeoX reduces attention + MLP once with parallel residual; the builtin model twice."""
    if engine_of(cfg).fused_parallel_residual and cfg.model.parallel_residual:
        return 1
    return 2


def messages(cfg: Config, layout: Layout) -> list[Message]:
    shape = stage_shape(cfg, layout)
    out: list[Message] = []
    out += _tensor_parallel(cfg, layout, shape)
    out += _pipeline(layout, shape)
    out += _data_parallel(cfg, layout, shape)
    if layout.world_size > 1:
        out.append(Message("control", "all_reduce", 8, layout.world_size, CONTROL_ALLREDUCES,
                           "step", 32))
    return out


def _tensor_parallel(cfg: Config, layout: Layout, shape: Shape) -> list[Message]:
    tp = layout.tp
    if tp == 1:
        return []
    forward = forward_allreduces_per_layer(cfg)
    if cfg.parallel.activation_checkpointing:
        forward *= 2  # the recomputed forward reduces again
    # the busiest stage's extras: the last stage's head backward all-reduce (with pp == 1
    # the first stage's embedding forward one too) and cross entropy's fp32 scalars
    tokens = layout.micro_batch * cfg.model.seq_length
    act, bits = shape.activation_bytes, shape.act_bits
    out = [
        Message("tp", "all_reduce", act, tp, shape.layers * forward + (layout.pp == 1),
                "microbatch", bits),
        # backward: megatron-core issues them async; the framework patch compresses those too
        Message("tp", "all_reduce", act, tp, shape.layers * 2 + 1, "microbatch", bits),
        Message("tp", "all_reduce", tokens * 4, tp, CE_ALLREDUCES, "microbatch", 32),
    ]
    if layout.pp > 1:
        out.append(Message("tp", "all_gather", act, tp, 2, "microbatch", bits))
    return out


def _pipeline(layout: Layout, shape: Shape) -> list[Message]:
    if layout.pp == 1:
        return []
    payload = shape.activation_bytes / layout.tp  # DeepSpeed partitions it over TP
    return [Message("pp", "p2p", payload, 2, 2, "microbatch", shape.act_bits)]


def _data_parallel(cfg: Config, layout: Layout, shape: Shape) -> list[Message]:
    dp = layout.dp
    if dp == 1:
        return []
    z = cfg.zero
    grad_bytes = shape.stage_params * shape.grad_bits / 8
    op = "reduce_to_owners" if z.reduce_to_owner else "all_reduce"
    out = _buckets("dp", op, grad_bytes, z.reduce_bucket_size, shape.grad_bits, dp)
    if z.stage >= 1:
        weight_bytes = shape.stage_params * shape.act_bits / 8
        out += _buckets("zero", "all_gather", weight_bytes, z.allgather_bucket_size,
                        shape.act_bits, dp)
    return out


def _buckets(dim: str, op: str, nbytes: float, bucket_elems: int, bits: int, group: int
             ) -> list[Message]:
    """DeepSpeed cuts the flat buffer into buckets of bucket_elems elements."""
    bucket_bytes = bucket_elems * bits / 8
    full = int(nbytes // bucket_bytes)
    out = []
    if full:
        out.append(Message(dim, op, bucket_bytes, group, full, "step", bits))
    rest = nbytes - full * bucket_bytes
    if rest > 0:
        out.append(Message(dim, op, rest, group, 1, "step", bits))
    return out
