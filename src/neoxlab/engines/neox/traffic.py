"""What GPT-NeoX's TP layers and pipeline send, per pipeline stage and micro-batch.

The performance model asks this through the engine record (`Engine.traffic`) instead of its
own counts for the builtin engine. Facts of GPT-NeoX at the locked commit and the DeepSpeed
pipeline engine it runs in (docs/measurements/2026-12-07-neox-cpu.md checks them against
the comm accounting):

- TP all-reduces of an activation ([seq, micro_batch, hidden] in the TP wire dtype): per
  layer 1 forward with parallel residual (gpt_j_residual: attention + MLP reduced once), else
  2, twice that with activation checkpointing (the recomputed forward), and 2 backward (the
  inputs of the column-parallel QKV and MLP); the first stage adds the vocab-parallel
  embedding's forward one, the last stage the column-parallel head's backward one.
- The last stage's vocab-parallel cross entropy: 3 all-reduces of one fp32 value per token
  (max logit, target logit, sum of exponentials; megatron/mpu/cross_entropy.py).
- The stages that load micro-batches (DeepSpeed: the first and the last) broadcast the
  tokens over TP from its rank 0 (mpu.broadcast_data: the sizes, 4 int64 per key, then
  micro_batch x (seq + 1) int64 ids).
- The pipeline: stages pass (hidden_states, attention_mask). DeepSpeed sends the bool mask
  as fp16 ([1, 1, seq, seq], whatever the micro-batch) with every activation; the gradient
  goes back without it. With TP > 1 it partitions the activation and its gradient over TP
  (pipe_partitioned, grad_partitioned: DeepSpeed's defaults, GPT-NeoX keeps them): a send
  is then PartitionedTensor's int64 metadata (ndims, the shape, parts, rank, parts + 1
  bounds) and a 1/tp part, and the partitioned tensors are all-gathered over TP: the input
  on every stage but the first, the output (re-assembled for backward) and the received
  gradient on every stage but the last. DeepSpeed's one-time shape message (1 KiB per stage
  pair at the first send) is not a per-step message and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping

from neoxlab.config import Config
from neoxlab.layout import Layout, stage_layers
from neoxlab.messages import Message

CE_ALLREDUCES = 3  # max logit, target logit, sum of exponentials (fp32, one per token)
DATA_DIMS = 4  # mpu.data._MAX_DATA_DIM: int64 sizes per key in broadcast_data's first call
MASK_BITS = 16  # DeepSpeed casts the bool attention mask to half before a send
ACTIVATION_DIMS = 3  # [seq, micro_batch, hidden]
INT64 = 64


def messages(cfg: Config, layout: Layout, bits: Mapping[str, int]) -> list[Message]:
    """GPT-NeoX's TP and pipeline messages of one step (`bits`: each dimension's wire width)."""
    return tensor_parallel(cfg, layout, bits) + pipeline(cfg, layout, bits)


def _per_stage(counts: list[float], dim: str, op: str, nbytes: float, group: int,
               float_bits: int, raw: bool = False) -> list[Message]:
    """One message whose calls differ by stage; none when no stage issues it."""
    if max(counts) == 0:
        return []
    return [Message(dim, op, nbytes, group, max(counts), "microbatch", float_bits,
                    stage_counts=tuple(counts), raw=raw)]


def tensor_parallel(cfg: Config, layout: Layout, bits: Mapping[str, int]) -> list[Message]:
    tp, pp, m = layout.tp, layout.pp, cfg.model
    if tp == 1:
        return []
    first, last = 0, pp - 1
    forward = 1 if m.parallel_residual else 2
    if cfg.parallel.activation_checkpointing:
        forward *= 2
    elems = layout.micro_batch * m.seq_length * m.hidden_size
    tokens = layout.micro_batch * m.seq_length
    reduces = [n * (forward + 2) + (s == first) + (s == last)
               for s, n in enumerate(stage_layers(m.num_layers, pp))]
    loads = [float(s in (first, last)) for s in range(pp)]
    out = _per_stage(reduces, "tp", "all_reduce", elems * bits["tp"] / 8, tp, bits["tp"])
    out += _per_stage([CE_ALLREDUCES * (s == last) for s in range(pp)], "tp", "all_reduce",
                      tokens * 4, tp, 32)
    keys = 1  # "text" (GPT-NeoX adds "label" only with train_label_data_paths)
    out += _per_stage(loads, "tp", "broadcast", DATA_DIMS * keys * 8, tp, INT64, raw=True)
    out += _per_stage(loads, "tp", "broadcast", layout.micro_batch * (m.seq_length + 1) * 8,
                      tp, INT64, raw=True)
    if pp > 1:  # the partitioned pipeline tensors, re-assembled: the pipeline's dtype
        gathers = [(s > first) + 2 * (s < last) for s in range(pp)]
        out += _per_stage(gathers, "tp", "all_gather", elems * bits["pp"] / 8, tp, bits["pp"])
    return out


def partition_meta_bytes(tp: int) -> int:
    """PartitionedTensor.to_meta(): ndims, the shape, parts, rank and parts + 1 bounds."""
    return (1 + ACTIVATION_DIMS + 2 + tp + 1) * INT64 // 8


def pipeline(cfg: Config, layout: Layout, bits: Mapping[str, int]) -> list[Message]:
    """Per stage boundary and micro-batch, each send once (accounted on both ends)."""
    tp, m = layout.tp, cfg.model
    if layout.pp == 1:
        return []
    b = bits["pp"]
    part = layout.micro_batch * m.seq_length * m.hidden_size / tp * b / 8
    out: list[Message] = []
    if tp > 1:  # forward and backward each lead with the partition's metadata
        out.append(Message("pp", "p2p", partition_meta_bytes(tp), 2, 2, "microbatch", INT64,
                           raw=True))
    out += [
        Message("pp", "p2p", part, 2, 1, "microbatch", b),  # the activation (its part)
        Message("pp", "p2p", m.seq_length ** 2 * MASK_BITS / 8, 2, 1, "microbatch", MASK_BITS),
        Message("pp", "p2p", part, 2, 1, "microbatch", b),  # its gradient, back
    ]
    return out
