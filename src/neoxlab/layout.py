"""Pure layout arithmetic and its rules: world size, batch identities, memory per device.

Imports only the config schema. The rules of tasks, engines, clusters and compression live
beside their code; commands/check.py runs them all together with these, so every violation is
reported at once, with its numbers and a fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neoxlab.comm_scratch import op_scratch_bytes
from neoxlab.config import Config, ConfigError, ModelConfig

GIB = 1024**3
PRECISIONS = ("fp32", "fp16", "bf16")
WANDB_MODES = ("offline", "online", "disabled")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Layout:
    world_size: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the busiest device (a first/last pipeline stage)."""

    params_per_device: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    # the largest scratch of one compressed collective: they run one after another (on one
    # side stream per device, whose memory pool is its own), so the largest one is held
    communication: float = 0.0
    residuals: float = 0.0  # error feedback: one residual per DP bucket, i.e. the gradients

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.communication + self.residuals)


def padded_vocab_size(model: ModelConfig, tp: int) -> int:
    """GPT-NeoX pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = model.make_vocab_size_divisible_by * tp
    return int(math.ceil(model.vocab_size / multiple) * multiple)


def world_size(cfg: Config) -> int:
    return cfg.cluster.nodes * cfg.cluster.ranks_per_node


def resolve_layout(cfg: Config) -> Layout:
    """The layout with dp inferred; raises ConfigError listing every violated layout rule
    (commands/check.py's check() adds every other rule)."""
    errors = validate(cfg) or memory_errors(cfg)
    if errors:
        raise ConfigError(format_errors(cfg.experiment, errors))
    return layout_of(cfg)


def layout_of(cfg: Config) -> Layout:
    """The layout arithmetic alone (dp inferred), without checking any rule."""
    p = cfg.parallel
    world = world_size(cfg)
    dp = p.dp if p.dp is not None else world // (p.tp * p.pp)
    return Layout(world, p.tp, p.pp, dp, p.micro_batch, p.grad_accum)


def format_errors(experiment: str, errors: list[str]) -> str:
    head = f"experiment '{experiment}' is not runnable ({len(errors)} problem(s)); nothing started:"
    lines = [head]
    lines += [f"  - {e}" for e in errors]
    return "\n".join(lines)


def layer_params(model: ModelConfig) -> int:
    """One block: QKV 3h^2+3h, dense h^2+h, MLP 8h^2+5h (ffn 4h), two LayerNorms 4h."""
    h, f = model.hidden_size, model.ffn_mult * model.hidden_size
    return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h


def total_params(model: ModelConfig, tp: int = 1) -> int:
    embed = padded_vocab_size(model, tp) * model.hidden_size
    head = 0 if model.tie_embeddings else embed
    return embed + head + model.num_layers * layer_params(model) + 2 * model.hidden_size


def stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Transformer layers of every pipeline stage: DeepSpeed balances their count, the
    first stages taking one more where they do not divide."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if s < extra else 0) for s in range(pp))


def estimate_memory(cfg: Config, layout: Layout) -> MemoryEstimate:
    """Busiest device's bytes for weights, gradients, Adam states and activations.

    - parameters: ceil(layers/pp) blocks plus the embedding (first stage) or head (last),
      split over tp;
    - 16-bit training keeps 2-byte weights and gradients and 12 bytes of fp32 master weight
      and Adam moments per parameter; fp32 keeps 4 + 4 and 8 bytes of moments. ZeRO-1
      shards the optimizer bytes over dp, ZeRO-2 also the gradients;
    - activations per block and micro-batch (Korthikanti et al., 2022, no sequence
      parallelism, 16-bit): s*b*h*(10 + 24/tp + 5*a*s/(h*tp)) bytes; with full activation
      checkpointing only the block input 2*s*b*h is kept, plus one block recomputed.
      1F1B keeps min(pp, grad_accum) micro-batches in flight on the first stage.
    """
    m, z = cfg.model, cfg.zero
    blocks = math.ceil(m.num_layers / layout.pp)
    vocab_rows = padded_vocab_size(m, layout.tp) * m.hidden_size
    params = (blocks * layer_params(m) + vocab_rows) // layout.tp
    half = cfg.train.precision in ("fp16", "bf16")
    weight_b, grad_b, optim_b = (2, 2, 12) if half else (4, 4, 8)
    optimizer = params * optim_b / (layout.dp if z.stage >= 1 else 1)
    gradients = params * grad_b / (layout.dp if z.stage >= 2 else 1)
    s, b, h, a = m.seq_length, layout.micro_batch, m.hidden_size, m.num_attention_heads
    per_block = s * b * h * (10 + 24 / layout.tp + 5 * a * s / (h * layout.tp))
    in_flight = min(layout.pp, layout.grad_accum)
    if cfg.parallel.activation_checkpointing:
        activations = blocks * in_flight * 2 * s * b * h + per_block
    else:
        activations = blocks * in_flight * per_block
    if not half:
        activations *= 2
    act_b = 2 if half else 4
    scratch = _compression_scratch(cfg, layout, params, (weight_b, grad_b, act_b))
    residuals = params * grad_b if _compressed(cfg, "dp", error_feedback=True) else 0
    return MemoryEstimate(params, params * weight_b, gradients, optimizer, activations,
                          scratch, float(residuals))


def _compressed(cfg: Config, dim: str, error_feedback: bool = False) -> bool:
    """Whether the framework compresses dimension dim (with error feedback, if asked)."""
    c = cfg.compression
    d = c.dims.get(dim)
    on = c.patch and c.backend == "framework" and d is not None and d.compressor != "none"
    return bool(on and (d.error_feedback or not error_feedback))


def _compression_scratch(cfg: Config, layout: Layout, params: int,
                         widths: tuple[int, int, int]) -> float:
    """The largest extra memory of one compressed collective the run makes (0 when none
    is compressed): DP gradient buckets (all-reduced, reduced to owners or reduce-
    scattered), ZeRO's parameter all-gathers, TP all-reduces and PP sends of activations."""
    weight_b, grad_b, act_b = widths
    m, z = cfg.model, cfg.zero
    bucket = min(params * grad_b, z.reduce_bucket_size * grad_b)
    activation = m.seq_length * layout.micro_batch * m.hidden_size * act_b
    calls: list[tuple[str, int, int, int]] = []  # (op, message bytes, group, itemsize)
    if _compressed(cfg, "dp") and layout.dp > 1:
        calls.append(("all_reduce", bucket, layout.dp, grad_b))
        if z.reduce_to_owner:
            calls.append(("reduce", bucket, layout.dp, grad_b))
        if z.stage >= 2:
            calls.append(("reduce_scatter", bucket, layout.dp, grad_b))
    if _compressed(cfg, "zero") and layout.dp > 1 and z.stage >= 1:
        shard = min(params, z.allgather_bucket_size) * weight_b // layout.dp
        calls.append(("all_gather", shard, layout.dp, weight_b))
    if _compressed(cfg, "tp") and layout.tp > 1:
        calls.append(("all_reduce", activation, layout.tp, act_b))
    if _compressed(cfg, "pp") and layout.pp > 1:
        calls += [("send", activation, 2, act_b), ("recv", activation, 2, act_b)]
    return float(max((op_scratch_bytes(op, nbytes, n, size) for op, nbytes, n, size in calls),
                     default=0))


def _positive(errors: list[str], name: str, value: int | float, fix: str) -> None:
    if value < 1:
        errors.append(f"{name}={value} must be >= 1; {fix}")


def _choice(errors: list[str], name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        errors.append(f"{name}='{value}' is not one of {list(allowed)}; pick one of them")


def basic_errors(cfg: Config) -> list[str]:
    """Positive sizes and known choices: what the arithmetic of validate() needs."""
    errors: list[str] = []
    p, m, c = cfg.parallel, cfg.model, cfg.cluster
    for name, value in (
        ("parallel.tp", p.tp), ("parallel.pp", p.pp), ("parallel.micro_batch", p.micro_batch),
        ("parallel.grad_accum", p.grad_accum), ("cluster.nodes", c.nodes),
        ("cluster.ranks_per_node", c.ranks_per_node), ("train.steps", cfg.train.steps),
        ("model.num_layers", m.num_layers), ("model.hidden_size", m.hidden_size),
        ("model.num_attention_heads", m.num_attention_heads),
        ("model.seq_length", m.seq_length), ("model.vocab_size", m.vocab_size),
    ):
        _positive(errors, name, value, "use a positive integer")
    if p.dp is not None and p.dp < 1:
        errors.append(f"parallel.dp={p.dp} must be >= 1 or null (inferred); use null")
    _choice(errors, "train.precision", cfg.train.precision, PRECISIONS)
    _choice(errors, "logger.wandb", cfg.logger.wandb, WANDB_MODES)
    _choice(errors, "engine.backend", cfg.engine.backend, BACKENDS)
    return errors


def validate(cfg: Config) -> list[str]:
    """Every violated layout rule, each with its numbers and a fix; empty when runnable."""
    errors = basic_errors(cfg)
    if errors:  # the arithmetic below needs positive sizes
        return errors
    p, m, z, c = cfg.parallel, cfg.model, cfg.zero, cfg.cluster
    world = world_size(cfg)
    if p.dp is None and world % (p.tp * p.pp):
        errors.append(
            f"world size {world} (cluster.nodes={c.nodes} x ranks_per_node={c.ranks_per_node}) "
            f"is not divisible by tp*pp={p.tp}*{p.pp}={p.tp * p.pp}; change the node count or "
            "tp/pp so that tp*pp divides it"
        )
    elif p.dp is not None and p.tp * p.pp * p.dp != world:
        errors.append(
            f"world size {world} (cluster.nodes={c.nodes} x ranks_per_node={c.ranks_per_node}) "
            f"!= tp*pp*dp = {p.tp}*{p.pp}*{p.dp} = {p.tp * p.pp * p.dp}; set parallel.dp=null "
            "to infer it, or change the nodes"
        )
    if m.num_attention_heads % p.tp:
        errors.append(
            f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
            f"parallel.tp={p.tp}: heads are split over TP; use a tp that divides the heads"
        )
    if m.hidden_size % m.num_attention_heads:
        errors.append(
            f"model.hidden_size={m.hidden_size} is not divisible by num_attention_heads="
            f"{m.num_attention_heads}; choose sizes with an integer head dimension"
        )
    elif rotary_dim_of(m) % 2:
        errors.append(
            f"rotary dimension {rotary_dim_of(m)} (head dim x rotary_pct={m.rotary_pct}) is odd;"
            " choose rotary_pct so that it is even"
        )
    if (m.ffn_mult * m.hidden_size) % p.tp:
        errors.append(f"MLP width {m.ffn_mult * m.hidden_size} is not divisible by tp={p.tp}")
    if not 0.0 <= m.rotary_pct <= 1.0:
        errors.append(f"model.rotary_pct={m.rotary_pct} must be in [0, 1]")
    if m.num_layers < p.pp:
        errors.append(
            f"model.num_layers={m.num_layers} < parallel.pp={p.pp}: every pipeline stage needs "
            "at least one transformer layer; lower pp or add layers"
        )
    if m.seq_length > m.max_position_embeddings:
        errors.append(
            f"model.seq_length={m.seq_length} > max_position_embeddings="
            f"{m.max_position_embeddings}; shorten the sequence or raise the limit"
        )
    if padded_vocab_size(m, p.tp) % p.tp:
        errors.append(f"padded vocabulary {padded_vocab_size(m, p.tp)} not divisible by tp={p.tp}")
    if z.stage not in (0, 1, 2, 3):
        errors.append(f"zero.stage={z.stage} must be 0, 1, 2 or 3")
    elif z.stage >= 2 and p.pp > 1:
        errors.append(
            f"zero.stage={z.stage} with parallel.pp={p.pp}: DeepSpeed's pipeline engine cannot "
            "partition gradients (ZeRO-2/3) across micro-batches of a pipeline; use zero.stage=1"
            " or pp=1"
        )
    if z.reduce_to_owner and (z.stage not in (1, 2) or not z.reduce_scatter):
        errors.append(
            f"zero.reduce_to_owner=true with zero.stage={z.stage}, zero.reduce_scatter="
            f"{str(z.reduce_scatter).lower()}: DeepSpeed reduces gradient partitions to their "
            "owners only under ZeRO-1/2 with reduce_scatter; use zero.stage=1 "
            "zero.reduce_scatter=true or drop zero.reduce_to_owner"
        )
    if c.device == "cpu" and cfg.engine.backend == "nccl":
        errors.append("engine.backend='nccl' needs GPUs but cluster.device='cpu'; use gloo")
    if cfg.data.source == "file" and not cfg.data.path:
        errors.append("data.source='file' needs data.path=<text file>; give the path")
    elif cfg.data.source not in ("stdlib", "file"):
        errors.append(f"data.source='{cfg.data.source}' is not one of ['stdlib', 'file']")
    return errors


def rotary_dim_of(model: ModelConfig) -> int:
    return int(model.hidden_size // model.num_attention_heads * model.rotary_pct)


def memory_errors(cfg: Config) -> list[str]:
    """The memory estimate against the device; only meaningful on an otherwise valid config."""
    errors: list[str] = []
    layout = layout_of(cfg)
    est = estimate_memory(cfg, layout)
    capacity = cfg.cluster.device_memory_gib * GIB
    if est.total > capacity:
        errors.append(
            f"estimated memory per device {est.total / GIB:.1f} GiB (weights "
            f"{est.weights / GIB:.1f}, gradients {est.gradients / GIB:.1f}, optimizer "
            f"{est.optimizer / GIB:.1f}, activations {est.activations / GIB:.1f}, compressed "
            f"collective scratch {est.communication / GIB:.2f}, error-feedback residuals "
            f"{est.residuals / GIB:.2f}) exceeds "
            f"{cfg.cluster.name}'s {cfg.cluster.device_memory_gib} GiB at tp={layout.tp}, "
            f"pp={layout.pp}, dp={layout.dp}; raise tp/pp, use ZeRO-1, activation "
            "checkpointing or a smaller micro batch"
        )
    return errors
