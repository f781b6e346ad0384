"""Step time of a layout from its traffic, its FLOPs and the cluster profile.

With m micro-batches per step and pp stages, DeepSpeed's 1F1B schedule runs m slots of one
micro-batch's forward + backward on the busiest stage, plus one slot of every other stage
while the pipeline fills and drains (pp - 1 slots when the stages are balanced); each stage
boundary is crossed on the critical path by one activation and one gradient (pp_mb, both
messages of a micro-batch) while it fills and drains, and in between the p2p overlaps the
stages' work but for what a message takes beyond a slot:

  slot   = compute + overhead + tp + codec(tp, pp)          per micro-batch
  step   = m slot + sum over the other stages of their slot + (pp - 1) pp_mb
           + m max(0, pp_mb / 2 - slot) + (1 - dp_overlap) dp
           + (1 - zero_overlap) zero + codec(dp, zero) + step overhead + control all-reduces

(2x2-pp on the emulated cluster, pp_mb counted in every slot: every scheme 50-89 % slow.)

compute = FLOPs of the step (metrics.flops_per_iteration) / (world x m) x the stage's share
of layers / the achievable rate; another stage's slot is the busiest one's scaled by its
share of layers. The fill and drain slots are reported as `bubble`;
`overhead` holds the framework overheads and the control all-reduces.

Ranks sharing cores (CPU clusters, `shared_cores`): the profile holds values for a core of
one's own, and a step is the longer of the critical path, slowed by the share of a core its
busy ranks get, and an average rank's CPU work (compute, overheads, codecs) at its share of
the cores (see slowdowns()); idle pipeline stages lend their cores to busy ones. Time on an
inter-node link is wire time and is not slowed, and the codecs of collectives across one are
slowed by their own group and by the other ranks as far as their codecs' share of their
collectives keeps them on the cores (codec_on_path()); the ranks of emulated nodes
(cluster.emulated) all share this machine's cores_per_node cores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from neoxlab import metrics
from neoxlab.compress import make_compressor
from neoxlab.compress.base import WIDTH_DTYPES
from neoxlab.compress.kernels import cluster_choice
from neoxlab.compress.registry import codec_type
from neoxlab.config import Config, ConfigError
from neoxlab.config.profile import (
    CodecProfile,
    LinkProfile,
    MpiCompressionRules,
    PerfProfile,
)
from neoxlab.layout import Layout, padded_vocab_size, resolve_layout
from neoxlab.perfmodel import costs, traffic
from neoxlab.perfmodel.costs import Codec
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.perfmodel.topology import crosses_nodes

COMPONENTS = ("compute", "overhead", "tp", "pp", "bubble", "dp", "zero", "codec")
# a wire element width as an MPI library's rules name it (16 bits: fp16 or bf16, never
# compressed by a library that takes MPI_FLOAT / MPI_DOUBLE only)
WIRE_NAMES = {32: "fp32", 64: "fp64", 16: "fp16"}


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
    wire: dict[str, str] = field(default_factory=dict)  # dimension -> dtype its payloads travel in
    notes: list[str] = field(default_factory=list)
    slowdown: float = 1.0  # step / critical path at full speed (ranks sharing cores: > 1)
    bound: str = "critical path"  # or "cores": ranks sharing cores, their CPU work bounds it
    critical_s: float = 0.0  # the critical path, slowed by the ranks' share of the cores
    throughput_s: float = 0.0  # an average rank's CPU work at its share of the cores
    codec_path_s: float = 0.0  # the codecs on the critical path, as the sharing slows them

    def row(self) -> dict:
        """One flat table row (breakdown as <component>_s columns)."""
        data = asdict(self)
        data.pop("breakdown")
        data.pop("notes")
        links = data.pop("links")
        wire = data.pop("wire")
        data.update({f"{k}_s": v for k, v in self.breakdown.items()})
        data.update({f"{k}_link": v for k, v in links.items()})
        data.update({f"{k}_wire": v for k, v in wire.items()})
        return data


def predict(cfg: Config, profile: PerfProfile | None = None, origin: str = "",
            external: float | None = None, dtypes: Mapping[str, str] | None = None
            ) -> Prediction:
    """Validate (ConfigError on a bad layout or profile), then predict one step.

    external: threads of other jobs competing for the cores, measured during a run
    (perfmodel.stretch) on CPU machines shared with other jobs; None: an idle machine.
    dtypes: wire dtypes replacing the engine's for some dimensions (traffic.wire_dtypes)."""
    layout = resolve_layout(cfg)
    if profile is None:
        resolved = resolve_profile(cfg)
        profile, origin = resolved.profile, resolved.origin
    return predict_with(cfg, layout, profile, origin, external, dtypes)


def slowdowns(cfg: Config, layout: Layout, profile: PerfProfile, external: float | None,
              cpu_s: float = 0.0, wire_s: float = 0.0, free_s: float = 0.0
              ) -> tuple[float, float]:
    """(critical path, throughput) slowdowns of ranks sharing cores; (1, 1) with a device
    per rank. Competing threads: the node's ranks that are busy plus `external` ones; each
    gets cores / competitors of a core. Without a pipeline the ranks compute in lockstep (a
    collective every layer), so all of them are busy while any computes. A pipeline's stages
    are not in lockstep: a stage idles in pp - 1 of the m + pp - 1 slots, and a rank waiting
    for its peer (a latency) or on a shaped uplink's queue (gloo waits sleep) leaves its
    core to another stage's rank, where one whose bytes cross a veth does not (the cores
    carry its packets). So the ranks are busy for their share of the critical path, `cpu_s`
    (at own-core speed) slowed by s, `wire_s` not, less `free_s`, the wire time whose cores
    are free:
    u = m / (m + pp - 1) x (cpu s + wire - free) / (cpu s + wire), and
    s = (ranks u + external) / cores is solved for s (a quadratic). 2x2-pp's ranks (4 on 2
    cores, emulated) were busy 1.7-2.1 on average over their timelines, where
    m / (m + pp - 1) alone said 2.7."""
    if not profile.shared_cores:
        return 1.0, 1.0
    c = cfg.cluster
    cores = max(c.cores_per_node, 1)
    ranks = sharing_ranks(cfg, layout)
    m, pp = layout.grad_accum, layout.pp
    others = max(external or 0.0, 0.0)
    share = ranks * m / (m + pp - 1)
    path = (share + others) / cores
    if pp > 1 and cpu_s > 0 and free_s > 0:
        # cores s (cpu s + wire) = share (cpu s + wire - free) + others (cpu s + wire)
        a, b = cores * cpu_s, cores * wire_s - share * cpu_s - others * cpu_s
        c = share * (wire_s - free_s) + others * wire_s
        path = (-b + math.sqrt(b * b + 4 * a * c)) / (2 * a)
    return max(1.0, path), max(1.0, (ranks + others) / cores)


def sharing_ranks(cfg: Config, layout: Layout) -> int:
    """The ranks that share a node's cores; emulated nodes all run on this machine's."""
    if cfg.cluster.emulated is not None:
        return layout.world_size
    return max(min(cfg.cluster.ranks_per_node, layout.world_size), 1)


def predict_with(cfg: Config, layout: Layout, p: PerfProfile, origin: str,
                 external: float | None = None, dtypes: Mapping[str, str] | None = None
                 ) -> Prediction:
    """One step of a checked layout on a given profile (predict() resolves both first);
    for callers that price many configs on one profile (calibration, the emulated model)."""
    m, pp = layout.grad_accum, layout.pp
    shape = traffic.stage_shape(cfg, layout)
    vocab = padded_vocab_size(cfg.model, layout.tp)
    flops = metrics.flops_per_iteration(cfg.model, layout.global_batch, vocab,
                                        cfg.parallel.activation_checkpointing)
    compute_avg = flops / (layout.world_size * m) / (p.achievable_tflops * 1e12)
    compute_mb = compute_avg * shape.layers * pp / cfg.model.num_layers  # busiest stage
    overhead_mb = (p.layer_overhead_us * shape.layers + p.microbatch_overhead_us) * 1e-6
    overhead_avg = (p.layer_overhead_us * cfg.model.num_layers / pp
                    + p.microbatch_overhead_us) * 1e-6

    links = {dim: ("inter" if crosses_nodes(layout, dim, cfg.cluster.ranks_per_node)
                   else "intra") for dim in ("tp", "pp", "dp", "zero", "control")}
    per_dim = {dim: costs.ZERO for dim in links}
    per_mb = {dim: costs.ZERO for dim in links}
    # a pipeline on shared cores: the seconds of each dimension's comm that are latencies
    # (slowdowns' busy share); nothing else needs them
    interleaved = pp > 1 and p.shared_cores
    latency = {dim: 0.0 for dim in links}
    notes: list[str] = []
    messages = traffic.messages(cfg, layout, dtypes)
    # a reduce to owners' payloads cross one at a time (costs.compressed), so its ranks leave
    # it one after another and reach their codecs apart, not together
    staggered = {msg.dim for msg in messages if msg.op == "reduce_to_owners"}
    for msg in messages:
        link: LinkProfile = getattr(p, links[msg.dim])
        codec = codec_for(cfg, p, msg, notes)
        cost = costs.message_cost(msg, link, codec).scaled(msg.count)
        target = per_mb if msg.per == "microbatch" else per_dim
        target[msg.dim] = target[msg.dim] + cost
        if interleaved:
            latency[msg.dim] += costs.message_cost(msg, latencies_only(link), codec).comm_s * \
                msg.count * (m if msg.per == "microbatch" else 1)
    codec_mb = per_mb["tp"].codec_s + per_mb["pp"].codec_s
    tp_mb, pp_mb = per_mb["tp"].comm_s, per_mb["pp"].comm_s
    slot = compute_mb + overhead_mb + tp_mb + codec_mb  # a micro-batch, less its p2p
    others = (sum(shape.stage_layers) - shape.layers) / shape.layers  # the other stages' slots
    codec_step = per_dim["dp"].codec_s + per_dim["zero"].codec_s
    step_cpu = p.step_overhead_us * 1e-6
    breakdown = {
        "compute": m * compute_mb,
        "overhead": m * overhead_mb + step_cpu + per_dim["control"].comm_s,
        "tp": m * tp_mb,
        # a micro-batch's activation and gradient cross each stage boundary once while the
        # pipeline fills and drains; in between they overlap the stages' work, but for what
        # one takes beyond a slot (pp_mb: both messages of a micro-batch)
        "pp": (pp - 1) * pp_mb + m * max(0.0, pp_mb / 2 - slot),
        # 1F1B: the busiest stage paces m slots, every other stage adds its own once
        "bubble": slot * others,
        "dp": per_dim["dp"].comm_s * (1 - p.dp_overlap),
        "zero": per_dim["zero"].comm_s * (1 - p.zero_overlap),
        "codec": m * codec_mb + codec_step,
    }
    # time on an inter-node wire passes at the wire's pace, whatever share of a core the
    # waiting ranks get (emulated nodes: shaped uplinks), and so does time on a link fitted
    # under the run's load (emulated veths), the other stages' TP included; codecs as
    # codec_on_path says; everything else is slowed
    on_wire = {dim for dim in ("tp", "pp", "dp", "zero")
               if links[dim] == "inter" or getattr(p, links[dim]).fitted_under_load}
    wire = sum(breakdown[dim] for dim in on_wire) + ("tp" in on_wire) * tp_mb * others
    cpu_path = sum(breakdown.values()) - wire - breakdown["codec"]
    # the wire time in which the waiting ranks' cores are free: its latencies (a rank waits
    # for its peer) and, of the rest, what a shaped uplink's queue holds (a veth's packets
    # take the cores: busy_fraction 1)
    free = 0.0
    for dim in on_wire if interleaved else ():
        comm = per_dim[dim].comm_s + m * per_mb[dim].comm_s
        waits = latency[dim] / comm if comm > 0 else 0.0
        busy = getattr(p, links[dim]).busy_fraction
        share = waits + (1.0 - waits) * (1.0 - busy)
        free += share * (breakdown[dim] + (dim == "tp") * tp_mb * others)
    slow_path, slow_cores = slowdowns(cfg, layout, p, external, cpu_path, wire, free)

    group = {"tp": layout.tp, "pp": 2, "dp": layout.dp, "zero": layout.dp}
    sharing = sharing_ranks(cfg, layout)

    def on_path(cost: costs.Cost, dim: str) -> float:
        if dim in staggered:  # one transfer at a time leaves the other ranks' cores free
            return codec_on_path(cost.codec_s, cost.comm_s, slow_path, 1 / sharing)
        idle = 0.0  # the wire time in which the ranks' cores are free
        if links[dim] == "inter":
            idle = cost.comm_s * (1.0 - p.inter.busy_fraction)
        return codec_on_path(cost.codec_s, idle, slow_path, min(1.0, group[dim] / sharing))
    codec = (m * (on_path(per_mb["tp"], "tp") + on_path(per_mb["pp"], "pp"))
             + on_path(per_dim["dp"], "dp") + on_path(per_dim["zero"], "zero"))
    critical = (sum(breakdown.values()) - wire - breakdown["codec"]) * slow_path + wire + codec
    # ranks sharing cores: the CPU work of an average rank at its share of the cores
    work = m * (compute_avg + overhead_avg + codec_mb) + codec_step + step_cpu
    throughput = work * slow_cores if p.shared_cores else 0.0
    step = max(critical, throughput)
    scale = step / sum(breakdown.values())
    breakdown = {name: value * scale for name, value in breakdown.items()}
    return Prediction(
        experiment=cfg.experiment, scheme=cfg.compression.scheme, model=cfg.model.name,
        gpus=layout.world_size, tp=layout.tp, pp=pp, dp=layout.dp,
        micro_batch=layout.micro_batch, grad_accum=m, global_batch=layout.global_batch,
        step_s=step, tflops_per_gpu=metrics.tflops_per_gpu(flops, step, layout.world_size),
        samples_per_s=layout.global_batch / step, breakdown=breakdown, links=links,
        profile=origin, wire=traffic.wire_dtypes(cfg, dtypes), notes=sorted(set(notes)),
        slowdown=scale,
        bound="cores" if throughput > critical else "critical path",
        critical_s=critical, throughput_s=throughput, codec_path_s=codec,
    )


def latencies_only(link: LinkProfile) -> LinkProfile:
    """The link with bytes that take no time: a message's cost on it is its latencies."""
    return dataclasses.replace(link, bandwidth_gbs=math.inf,
                               full_gbs=None if link.full_gbs is None else math.inf)


def codec_on_path(codec_s: float, idle_wire_s: float, slow_path: float,
                  group_share: float = 1.0) -> float:
    """A collective's codec time on the critical path of ranks that share cores. The ranks
    of the collective's own group (`group_share` of those sharing the cores) leave each
    exchange together and encode and decode at once; the other ranks' groups run their own
    collectives, and while a wire that does not need the cores (a NIC; a shaped uplink below
    what the cores can push) carries their segments, they leave the cores free. So the codec
    is slowed by its own group and by the other ranks only for the codec's share of their
    collective (codec / (codec + idle wire)). Measured from the ranks' timelines
    (studies/codec_overlap.py) on the emulated sweep, 4 ranks on 2 cores: a DP codec took
    1.1-1.6x its one-thread time in 2x2 (2 DP groups) at 80 and 40 Mbit/s, 1.4-2.0x in 4x1
    (one group of 4) at every rate. No idle wire (links inside a node, the bare veths):
    the plain slowdown. A reduce to owners sends its payloads one at a time, so its ranks
    reach their codecs apart: each is slowed by the others only for their codecs' share of
    the serial transfers (its caller passes the whole wire time and its own share of the
    ranks): in 4x1-owner the DP codec took 1.2-1.4x its one-thread time at every rate, where
    lockstep said 2.0-2.5x."""
    if codec_s <= 0:
        return 0.0
    others_busy = codec_s / (codec_s + idle_wire_s)
    return codec_s * max(1.0, slow_path * (group_share + (1 - group_share) * others_busy))


def dim_seconds(cfg: Config, layout: Layout, profile: PerfProfile, dim: str, kind: str
                ) -> tuple[float, float]:
    """The model's wire and codec seconds per step of one dimension, as the compression
    patch times them (before any overlap with compute)."""
    comm = codec = 0.0
    link = getattr(profile, kind)
    for msg in traffic.messages(cfg, layout):
        if msg.dim != dim:
            continue
        cost = costs.message_cost(msg, link, codec_for(cfg, profile, msg, [])).scaled(msg.count)
        per_step = layout.grad_accum if msg.per == "microbatch" else 1
        comm += cost.comm_s * per_step
        codec += cost.codec_s * per_step
    return comm, codec


def codec_for(cfg: Config, p: PerfProfile, msg: traffic.Message, notes: list[str]
              ) -> Codec | None:
    """The dimension's compressor with its ratio on this message's element width; none for
    messages the compressing side leaves alone: under its min_bytes for the framework patch,
    outside the library's documented rules for compression.backend=mpi."""
    d = cfg.compression.dims.get(msg.dim)
    if d is None or d.compressor == "none" or msg.raw:
        return None
    min_bytes, feedback = d.min_bytes, d.error_feedback and msg.dim == "dp"
    if cfg.compression.backend == "mpi":
        rules = library_rules(cfg, p)
        refused = refused_by(rules, msg)
        if refused:
            notes.append(f"{msg.dim}: {cfg.cluster.mpi_library} sends {msg.op} uncompressed: "
                         f"{refused}")
            return None
        min_bytes = rules.p2p_min_bytes if msg.op == "p2p" else 0
        feedback = False  # the library keeps no residual
    elif msg.nbytes < d.min_bytes:
        return None
    profile = codec_profile(cfg, p, d.compressor, d.params, notes)
    if profile is None:
        raise ConfigError(
            f"compression.dims.{msg.dim}.compressor='{d.compressor}' has no throughput in "
            f"cluster '{cfg.cluster.name}' profile (cluster.profile.codecs has "
            f"{sorted(p.codecs)}); add codecs.{d.compressor} with its source, or predict "
            "without that compressor"
        )
    profile = kernel_profile(cfg, profile, d.compressor, notes)
    ratio = codec_ratio(d.compressor, d.params, msg.float_bits, profile.ratio)
    if ratio <= 1.0:
        shrinks = make_compressor({"name": d.compressor, **d.params}).shrinks(
            WIDTH_DTYPES[msg.float_bits])
        if cfg.compression.backend != "mpi" and shrinks is False:
            # the patch leaves such traffic on the plain collective (comm/patch.py asks the
            # codec the same question); a data-dependent codec still encodes
            notes.append(f"{msg.dim}: {d.compressor} {d.params} on {msg.float_bits}-bit values "
                         f"does not shrink them (ratio {ratio:.2f}): sent raw, no encode")
            return None
        notes.append(f"{msg.dim}: {d.compressor} {d.params} on {msg.float_bits}-bit values "
                     f"does not shrink them (ratio {ratio:.2f}): sent raw, encode still paid")
    return Codec(d.compressor, ratio, profile, min_bytes, feedback)


def codec_profile(cfg: Config, p: PerfProfile, name: str, params: dict, notes: list[str]
                  ) -> CodecProfile | None:
    """The profile's throughput of a codec: timed with these very parameters (ZFP's rate
    sets how many bit planes it codes: rate 24 runs ~2x slower than rate 8), else the
    codec's own, else that of its cost class (a codec doing the same passes over the
    data, as the codec states it), said in a note."""
    own = p.codecs.get(spec_key(name, params)) or p.codecs.get(name)
    if own is not None:
        return own
    cost_class = codec_type(name).cost_class
    borrowed = p.codecs.get(cost_class) if cost_class else None
    if borrowed is not None:
        notes.append(f"{name}: no codecs.{name} in cluster '{cfg.cluster.name}' profile, "
                     f"priced as {cost_class} (its cost class)")
    return borrowed


def library_rules(cfg: Config, p: PerfProfile) -> MpiCompressionRules:
    """The cluster's MPI library's compression rules (profile data); ConfigError without."""
    library = cfg.cluster.mpi_library
    rules = p.mpi_compression.get(library)
    if rules is None:
        raise ConfigError(
            f"compression.backend=mpi: cluster '{cfg.cluster.name}' profile has no "
            f"mpi_compression.{library} rules (it has {sorted(p.mpi_compression)}), so what "
            f"cluster.mpi_library='{library}' compresses is unknown; add them to "
            f"configs/cluster/{cfg.cluster.name}.yaml's profile with the library's "
            "documentation as source, or predict with compression.backend=framework")
    return rules


def refused_by(rules: MpiCompressionRules, msg: traffic.Message) -> str | None:
    """Why the library leaves the message uncompressed, or None when it compresses it."""
    dtype = WIRE_NAMES.get(msg.float_bits, f"{msg.float_bits}-bit")
    if dtype not in rules.dtypes:
        return f"{dtype} is not one of the types it compresses ({rules.dtypes})"
    if msg.op not in rules.ops:
        return f"it compresses {rules.ops} only"
    if msg.op == "p2p" and rules.p2p_max_bytes is not None and msg.nbytes > rules.p2p_max_bytes:
        return f"{msg.nbytes:.0f} B is over its point-to-point limit of {rules.p2p_max_bytes} B"
    return None


def kernel_profile(cfg: Config, profile: CodecProfile, name: str, notes: list[str]
                   ) -> CodecProfile:
    """The codec's throughput as the cluster runs it, decided as the ranks decide
    (compress/kernels.py) from cluster.device and cluster.arch: Triton's (the profile's
    encode_gbs), else its NVRTC kernels when the profile prices them (assumed until
    measured: the note says which), else its torch-ops path (e.g. Lassen's ppc64le)."""
    c = cfg.cluster
    if not codec_type(name).fused() or c.device == "cpu" or cfg.compression.backend == "mpi":
        return profile  # backend=mpi: the MPI library's own GPU codecs, as profiled
    kind = cluster_choice(c.device, c.arch, profile.nvrtc_encode_gbs is not None).kernels
    if kind == "triton":
        return profile
    if kind == "nvrtc":
        enc = profile.nvrtc_encode_gbs or profile.encode_gbs
        dec = profile.nvrtc_decode_gbs or enc
        prov = c.profile.provenance if c.profile is not None else {}
        how = prov.get(f"codecs.{name}.nvrtc_encode_gbs", "assumed: no source in the profile")
        notes.append(f"{name}: no Triton on cluster.arch={c.arch}, priced at its NVRTC kernels "
                     f"({enc:g}/{dec:g} GB/s encode/decode; {how})")
        return dataclasses.replace(profile, encode_gbs=enc, decode_gbs=dec)
    enc = profile.torch_encode_gbs or profile.encode_gbs
    dec = profile.torch_decode_gbs or profile.decode_gbs
    notes.append(f"{name}: no Triton on cluster.arch={c.arch}, priced at its torch-ops path "
                 f"({enc:g}/{dec:g} GB/s encode/decode)")
    return dataclasses.replace(profile, encode_gbs=enc, decode_gbs=dec)


def spec_key(name: str, params: dict) -> str:
    """A compressor and its parameters as a spec string ('zfp:rate=24'), the key of a codec
    profile timed with those parameters."""
    if not params:
        return name
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def codec_ratio(name: str, params: dict, float_bits: int, profile_ratio: float | None
                ) -> float:
    """Raw bits over the bits the codec itself says it sends per value (compress:
    ``wire_bits``; below 1 when it cannot shrink the width); for a data-dependent codec
    (mpc) the profile's measured ratio."""
    bits = make_compressor({"name": name, **params}).wire_bits(WIDTH_DTYPES[float_bits])
    if bits is not None:
        return float_bits / bits
    if profile_ratio is None:
        raise ConfigError(
            f"compressor '{name}' has a data-dependent ratio: give codecs.{name}.ratio in the "
            "cluster profile (with its source, e.g. a bench/compressors.py measurement)"
        )
    return profile_ratio


def gain_pct(value: float, baseline: float) -> float:
    return (value / baseline - 1.0) * 100.0 if baseline > 0 else math.nan
