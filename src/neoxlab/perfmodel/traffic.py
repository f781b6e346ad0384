"""What one training step sends: messages per dimension from the model shape and layout.

Counts follow the builtin engine (megatron-core TP layers in a DeepSpeed pipeline) and were
checked against the comm accounting of real runs (tests/unit/test_perfmodel.py). An engine
whose record states its own TP and pipeline traffic (`Engine.traffic`: GPT-NeoX's, per
pipeline stage, with its attention mask; engines/neox/traffic.py) replaces the first two:

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
- PP, per micro-batch on the critical path: the activation forward and its gradient back
  (a p2p is accounted on both ends of its stage pair, as the comm accounting records a send
  and its recv: 2 calls per rank, 2 payloads per boundary).
- DP: one all-reduce of the stage's gradients per step (DeepSpeed's ZeRO-1 reduces buckets
  with all-reduce), then with ZeRO >= 1 an all-gather of the updated parameters.
- control: a few scalar all-reduces per step (loss, overflow check, gradient norm; about 3
  per rank in the accounting of local runs), latency only, never compressed.

Each dimension's payloads travel in the dtype the engine's files give them (the engine
record's wire_dtypes: the training precision, DeepSpeed's communication_data_type for DP
gradients, GPT-NeoX's fp32_allreduce for TP all-reduces); the all-gathers of partitioned
activations carry the pipeline's dtype. Bytes, codec ratios and codec time follow from it.
The casts to and from a wider wire dtype are not priced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from neoxlab.config import Config, ConfigError
from neoxlab.engines.registry import engine_of
from neoxlab.layout import Layout, estimate_memory, stage_layers
from neoxlab.messages import Message

BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp64": 64}  # element width of a wire dtype
WIRE_DIMS = ("tp", "pp", "dp", "zero")  # the dimensions whose payload dtype varies
CE_ALLREDUCES = 3  # max logit, target logit, sum of exponentials (fp32, one per token)
CONTROL_ALLREDUCES = 3  # per step: loss, overflow check, gradient norm (scalars)


@dataclass(frozen=True)
class Shape:
    """Per-rank sizes of the busiest pipeline stage, in elements (bytes follow the wire dtype)."""

    layers: int  # transformer layers on the stage
    stage_layers: tuple[int, ...]  # layers of every stage (DeepSpeed balances their count)
    activation_elems: float  # one [micro_batch, seq, hidden] tensor
    stage_params: int  # parameters one rank holds (stage / tp)


def stage_shape(cfg: Config, layout: Layout) -> Shape:
    m = cfg.model
    act = layout.micro_batch * m.seq_length * m.hidden_size
    params = estimate_memory(cfg, layout).params_per_device
    return Shape(math.ceil(m.num_layers / layout.pp), stage_layers(m.num_layers, layout.pp),
                 act, params)


def wire_dtypes(cfg: Config, override: Mapping[str, str] | None = None) -> dict[str, str]:
    """tp, pp, dp, zero -> the dtype their payloads travel in: the engine's, then `override`
    (a what-if of the sensitivity table); ConfigError on a dtype or dimension not known."""
    dtypes = dict(engine_of(cfg).wire_dtypes(cfg))
    for dim, dtype in (override or {}).items():
        if dim not in WIRE_DIMS or dtype not in BITS:
            raise ConfigError(f"wire dtype {dim}={dtype!r}: dimensions are {list(WIRE_DIMS)}, "
                              f"dtypes {list(BITS)}; name one of each")
        dtypes[dim] = dtype
    return dtypes


def forward_allreduces_per_layer(cfg: Config) -> int:
    """GPT-NeoX reduces attention + MLP once with parallel residual; the builtin model twice."""
    if engine_of(cfg).fused_parallel_residual and cfg.model.parallel_residual:
        return 1
    return 2


def messages(cfg: Config, layout: Layout, dtypes: Mapping[str, str] | None = None
             ) -> list[Message]:
    """One step's traffic; `dtypes` overrides the engine's wire dtype of some dimensions.
    TP and PP are the engine record's `traffic` where it states its own (GPT-NeoX:
    engines/neox/traffic.py), else the counts above."""
    shape = stage_shape(cfg, layout)
    bits = {dim: BITS[dtype] for dim, dtype in wire_dtypes(cfg, dtypes).items()}
    out: list[Message] = []
    own = engine_of(cfg).traffic
    if own is not None:  # the engine states its own TP and pipeline traffic
        out += own(cfg, layout, bits)
    else:
        out += _tensor_parallel(cfg, layout, shape, bits)
        out += _pipeline(layout, shape, bits["pp"])
    out += _data_parallel(cfg, layout, shape, bits)
    if layout.world_size > 1:
        out.append(Message("control", "all_reduce", 8, layout.world_size, CONTROL_ALLREDUCES,
                           "step", 32))
    return out


def _tensor_parallel(cfg: Config, layout: Layout, shape: Shape, bits: dict[str, int]
                     ) -> list[Message]:
    tp = layout.tp
    if tp == 1:
        return []
    forward = forward_allreduces_per_layer(cfg)
    if cfg.parallel.activation_checkpointing:
        forward *= 2  # the recomputed forward reduces again
    # the busiest stage's extras: the last stage's head backward all-reduce (with pp == 1
    # the first stage's embedding forward one too) and cross entropy's fp32 scalars
    tokens = layout.micro_batch * cfg.model.seq_length
    b = bits["tp"]
    act = shape.activation_elems * b / 8
    out = [
        Message("tp", "all_reduce", act, tp, shape.layers * forward + (layout.pp == 1),
                "microbatch", b),
        # backward: megatron-core issues them async; the framework patch compresses those too
        Message("tp", "all_reduce", act, tp, shape.layers * 2 + 1, "microbatch", b),
        Message("tp", "all_reduce", tokens * 4, tp, CE_ALLREDUCES, "microbatch", 32),
    ]
    if layout.pp > 1:  # the stage boundary's activation, reassembled: the pipeline's dtype
        out.append(Message("tp", "all_gather", shape.activation_elems * bits["pp"] / 8, tp, 2,
                           "microbatch", bits["pp"]))
    return out


def _pipeline(layout: Layout, shape: Shape, bits: int) -> list[Message]:
    if layout.pp == 1:
        return []
    payload = shape.activation_elems * bits / 8 / layout.tp  # DeepSpeed partitions it over TP
    return [Message("pp", "p2p", payload, 2, 2, "microbatch", bits)]


def _data_parallel(cfg: Config, layout: Layout, shape: Shape, bits: dict[str, int]
                   ) -> list[Message]:
    dp = layout.dp
    if dp == 1:
        return []
    z = cfg.zero
    grad_bytes = shape.stage_params * bits["dp"] / 8
    op = "reduce_to_owners" if z.reduce_to_owner else "all_reduce"
    out = _buckets("dp", op, grad_bytes, z.reduce_bucket_size, bits["dp"], dp)
    if z.stage >= 1:
        weight_bytes = shape.stage_params * bits["zero"] / 8
        out += _buckets("zero", "all_gather", weight_bytes, z.allgather_bucket_size,
                        bits["zero"], dp)
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


def stage_calls(msg: Message, layout: Layout, group: list[int]) -> float:
    """Calls per rank of `msg` in one group of its dimension (the comm accounting's count):
    its pipeline stage's where the stages differ (a stage pair's: the first stage's), else
    `count`. Ranks are pipe-major (perfmodel.topology)."""
    if msg.stage_counts is None:
        return msg.count
    return msg.stage_counts[group[0] // (layout.dp * layout.tp)]
