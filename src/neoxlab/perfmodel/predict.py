"""Step time of a layout from its traffic, its FLOPs and the cluster profile.

With m micro-batches per step and pp stages, DeepSpeed's 1F1B schedule runs m + pp - 1
slots of one micro-batch's forward + backward on the busiest stage:

  slot   = compute + overhead + tp + pp + codec(tp, pp)          per micro-batch
  step   = (m + pp - 1) slot + (1 - dp_overlap) dp + (1 - zero_overlap) zero
           + codec(dp, zero) + step overhead + control all-reduces

compute = FLOPs of the step (metrics.flops_per_iteration) / (world x m) x the stage's share
of layers / the achievable rate; on CPU clusters with more busy ranks than cores, compute,
overheads and codecs stretch by busy ranks / cores (see stretch()). The (pp - 1) extra
slots are reported as `bubble`; `overhead` holds the framework overheads and the control
all-reduces (loss, overflow, norm).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from neoxlab import metrics
from neoxlab.config import Config, ConfigError
from neoxlab.layout import Layout, padded_vocab_size, resolve_layout
from neoxlab.perfmodel import costs, traffic
from neoxlab.perfmodel.costs import Codec, Cost
from neoxlab.perfmodel.profile import LinkProfile, PerfProfile
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.perfmodel.topology import crosses_nodes

COMPONENTS = ("compute", "overhead", "tp", "pp", "bubble", "dp", "zero", "codec")
# wire bits per value of the fixed-size codecs (zfp: its rate parameter)
FIXED_BITS = {"fp16": 16, "bf16": 16, "int8": 8, "int4": 4}


@dataclass
class Prediction:
    experiment: str
    scheme: str
    model: str
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    step_s: float
    tflops_per_gpu: float
    samples_per_s: float
    breakdown: dict[str, float]
    links: dict[str, str]  # dimension -> intra | inter
    profile: str
    notes: list[str] = field(default_factory=list)

    def row(self) -> dict:
        """One flat table row (breakdown as <component>_s columns)."""
        data = asdict(self)
        data.pop("breakdown")
        data.pop("notes")
        links = data.pop("links")
        data.update({f"{k}_s": v for k, v in self.breakdown.items()})
        data.update({f"{k}_link": v for k, v in links.items()})
        return data


def predict(cfg: Config, profile: PerfProfile | None = None, origin: str = "") -> Prediction:
    """Validate (ConfigError on a bad layout or profile), then predict one step."""
    layout = resolve_layout(cfg)
    if profile is None:
        resolved = resolve_profile(cfg)
        profile, origin = resolved.profile, resolved.origin
    return _predict(cfg, layout, profile, origin)


def stretch(cfg: Config, layout: Layout, profile: PerfProfile) -> float:
    """How much slower a rank runs when ranks share cores (1 on devices of their own).

    A stage idles in pp - 1 of the m + pp - 1 slots (gloo waits sleep), so on average
    ranks x m / (m + pp - 1) ranks of a node want a core at once."""
    c = cfg.cluster
    if not profile.shared_cores:
        return 1.0
    m, pp = layout.grad_accum, layout.pp
    busy = min(c.ranks_per_node, layout.world_size) * m / (m + pp - 1)
    return max(1.0, busy / max(c.cores_per_node, 1))


def _predict(cfg: Config, layout: Layout, p: PerfProfile, origin: str) -> Prediction:
    m, pp = layout.grad_accum, layout.pp
    k = stretch(cfg, layout, p)
    shape = traffic.stage_shape(cfg, layout)
    vocab = padded_vocab_size(cfg.model, layout.tp)
    flops = metrics.flops_per_iteration(cfg.model, layout.global_batch, vocab,
                                        cfg.parallel.activation_checkpointing)
    imbalance = shape.layers * pp / cfg.model.num_layers  # busiest stage / average stage
    compute_mb = flops / (layout.world_size * m) * imbalance / (p.achievable_tflops * 1e12) * k
    overhead_mb = (p.layer_overhead_us * shape.layers + p.microbatch_overhead_us) * 1e-6 * k

    links = {dim: ("inter" if crosses_nodes(layout, dim, cfg.cluster.ranks_per_node)
                   else "intra") for dim in ("tp", "pp", "dp", "zero", "control")}
    per_dim = {dim: costs.ZERO for dim in links}
    per_mb = {dim: costs.ZERO for dim in links}
    notes: list[str] = []
    for msg in traffic.messages(cfg, layout):
        link: LinkProfile = getattr(p, links[msg.dim])
        cost = costs.message_cost(msg, link, codec_for(cfg, p, msg, notes)).scaled(msg.count)
        cost = Cost(cost.comm_s, cost.codec_s * k)
        target = per_mb if msg.per == "microbatch" else per_dim
        target[msg.dim] = target[msg.dim] + cost
    codec_mb = per_mb["tp"].codec_s + per_mb["pp"].codec_s
    slot = compute_mb + overhead_mb + per_mb["tp"].comm_s + per_mb["pp"].comm_s + codec_mb
    dp_s = per_dim["dp"].comm_s * (1 - p.dp_overlap)
    zero_s = per_dim["zero"].comm_s * (1 - p.zero_overlap)
    codec_step = per_dim["dp"].codec_s + per_dim["zero"].codec_s
    step_overhead = p.step_overhead_us * 1e-6 * k + per_dim["control"].comm_s
    breakdown = {
        "compute": m * compute_mb,
        "overhead": m * overhead_mb + step_overhead,
        "tp": m * per_mb["tp"].comm_s,
        "pp": m * per_mb["pp"].comm_s,
        "bubble": (pp - 1) * slot,
        "dp": dp_s,
        "zero": zero_s,
        "codec": m * codec_mb + codec_step,
    }
    step = sum(breakdown.values())
    return Prediction(
        experiment=cfg.experiment, scheme=cfg.compression.scheme, model=cfg.model.name,
        gpus=layout.world_size, tp=layout.tp, pp=pp, dp=layout.dp,
        micro_batch=layout.micro_batch, grad_accum=m, global_batch=layout.global_batch,
        step_s=step, tflops_per_gpu=metrics.tflops_per_gpu(flops, step, layout.world_size),
        samples_per_s=layout.global_batch / step, breakdown=breakdown, links=links,
        profile=origin, notes=sorted(set(notes)),
    )


def codec_for(cfg: Config, p: PerfProfile, msg: traffic.Message, notes: list[str]
              ) -> Codec | None:
    """The dimension's compressor with its ratio on this message's element width."""
    d = cfg.compression.dims.get(msg.dim)
    if d is None or d.compressor == "none":
        return None
    profile = p.codecs.get(d.compressor)
    if profile is None:
        raise ConfigError(
            f"compression.dims.{msg.dim}.compressor='{d.compressor}' has no throughput in "
            f"cluster '{cfg.cluster.name}' profile (cluster.profile.codecs has "
            f"{sorted(p.codecs)}); add codecs.{d.compressor} with its source, or predict "
            "without that compressor"
        )
    ratio = codec_ratio(d.compressor, d.params, msg.float_bits, profile.ratio)
    if ratio <= 1.0:
        notes.append(f"{msg.dim}: {d.compressor} {d.params} on {msg.float_bits}-bit values "
                     f"does not shrink them (ratio {ratio:.2f}): sent raw, encode still paid")
    return Codec(d.compressor, ratio, profile, d.min_bytes,
                 d.error_feedback and msg.dim == "dp")


def codec_ratio(name: str, params: dict, float_bits: int, profile_ratio: float | None
                ) -> float:
    if name == "zfp":
        return float_bits / float(params.get("rate", 16))
    if name in FIXED_BITS:
        return float_bits / FIXED_BITS[name]
    if name == "topk":
        ratio = float(params.get("ratio", 0.01))  # value + int32 index per kept element
        return float_bits / (ratio * (float_bits + 32))
    if profile_ratio is None:
        raise ConfigError(
            f"compressor '{name}' has a data-dependent ratio: give codecs.{name}.ratio in the "
            "cluster profile (with its source, e.g. a bench/compressors.py measurement)"
        )
    return profile_ratio


def gain_pct(value: float, baseline: float) -> float:
    return (value / baseline - 1.0) * 100.0 if baseline > 0 else math.nan
