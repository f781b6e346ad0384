"""The hardware profile schema of a cluster (`cluster.profile` in configs/cluster/*.yaml).

Plain dataclasses with defaults only, part of the config schema; every value in a cluster
YAML carries its source in a comment. A profile may name a calibration JSON (written by
`python -m neoxlab.commands.calibrate`) whose values replace the YAML ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the names MpiCompressionRules may use
LIBRARY_OPS = ("p2p", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LIBRARY_DTYPES = ("fp32", "fp64", "fp16", "bf16")
MARKS = ("published", "measured", "assumed")  # how a provenance entry starts


@dataclass
class LinkProfile:
    """Alpha-beta parameters of one kind of link, seen from one rank."""

    latency_us: float = 10.0  # alpha: fixed cost of one message step of a collective
    # beta^-1: GB/s (1e9 B/s) one rank gets while every rank of its node uses the link
    bandwidth_gbs: float = 1.0
    # alpha of a point-to-point send/recv when it differs from a collective's step (gloo);
    # null: latency_us
    p2p_latency_us: float | None = None
    # the share of its wire time in which the link's transfers keep the ranks' own cores busy:
    # 0 where a NIC moves the bytes; on an emulated uplink the veths' packets are processed
    # by this machine's cores (1 on the bare path, which they bound; less on a slower shaped one)
    busy_fraction: float = 0.0
    # fitted with as many ranks sending at once as the run has on these cores (emulated veths):
    # core sharing is already in its alpha-beta, so its time is not slowed by it again
    fitted_under_load: bool = False
    # GB/s of transfers that keep the link full, as nothing waits on a ring step (a gather to
    # one rank; a compressed reduce to owners' payloads, one after another); null: bandwidth_gbs
    full_gbs: float | None = None


# Where the fused GPU codecs (Triton kernels; which codecs have them: compress's registry,
# fused_codecs) run: Triton publishes wheels for these CPU architectures only; a GPU node of
# another (Lassen's POWER9, ppc64le) runs the codecs' torch-ops path, about a hundred
# elementwise kernels per chunk.
TRITON_ARCHES = ("x86_64", "aarch64")


def torch_codecs_on(device: str, arch: str) -> bool:
    """Whether a cluster's GPUs run the codecs' torch-ops path (no Triton for its arch)."""
    return device != "cpu" and arch not in TRITON_ARCHES


@dataclass
class CodecProfile:
    """Throughput of one compressor on this cluster's device."""

    encode_gbs: float = 1.0  # GB/s of uncompressed input
    decode_gbs: float = 1.0  # GB/s of uncompressed output
    call_us: float = 0.0  # fixed cost per encode or decode call
    # compression ratio for codecs whose ratio depends on the data (mpc); null: from the
    # codec's parameters (zfp rate r: 32/r on fp32, 16/r on fp16/bf16)
    ratio: float | None = None
    # GB/s of the codec's torch-ops path, which a GPU runs where Triton has no wheel
    # (cluster.arch); null: the same as encode_gbs/decode_gbs
    torch_encode_gbs: float | None = None
    torch_decode_gbs: float | None = None


@dataclass
class MpiCompressionRules:
    """What an MPI library compresses on the fly, as its documentation states it: a
    compression.backend=mpi prediction prices every other message uncompressed."""

    source: str = ""  # the documentation the rules are read from (title, address, date)
    # element types it compresses (MPI_FLOAT: fp32, MPI_DOUBLE: fp64); fp16 sent as bytes is not
    dtypes: list[str] = field(default_factory=list)
    # operations it compresses on GPU buffers, in the model's names: p2p, all_reduce,
    # all_gather, reduce_scatter, all_to_all (a reduce to owners is a series of MPI_Reduce)
    ops: list[str] = field(default_factory=list)
    p2p_min_bytes: int = 0  # point-to-point messages below this go uncompressed
    p2p_max_bytes: int | None = None  # ... and above this (null: no limit)


@dataclass
class PerfProfile:
    source: str = ""  # one line: what the values are and where they come from
    achievable_tflops: float = 0.0  # dense training rate one device reaches (per core on CPUs)
    intra: LinkProfile = field(default_factory=LinkProfile)  # between ranks of a node
    inter: LinkProfile = field(default_factory=LinkProfile)  # between nodes
    codecs: dict[str, CodecProfile] = field(default_factory=dict)
    # framework costs not in the FLOPs (Python, kernel launches, pipeline instructions)
    layer_overhead_us: float = 0.0  # per transformer layer and micro-batch (fwd + bwd)
    microbatch_overhead_us: float = 0.0  # per micro-batch and pipeline stage
    step_overhead_us: float = 0.0  # per step (optimizer, overflow and norm checks)
    # overlap assumptions: fraction of each cost hidden behind compute
    dp_overlap: float = 0.0  # DP gradient reduction behind the backward pass
    zero_overlap: float = 0.0  # ZeRO-1 parameter all-gather behind the next forward
    # CPU clusters: ranks share cores, so compute and overheads stretch by
    # ranks_per_node / cores_per_node when there are more ranks than cores
    shared_cores: bool = False
    # per cluster.mpi_library: what it compresses on the fly (compression.backend=mpi)
    mpi_compression: dict[str, MpiCompressionRules] = field(default_factory=dict)
    # a value's dotted path ('intra.bandwidth_gbs', 'codecs.zfp') -> "published: <source>",
    # "measured: <source>" or "assumed: <reason>" (the sensitivity table prints them)
    provenance: dict[str, str] = field(default_factory=dict)
    # a JSON (path relative to launch.results_dir) whose values replace these; missing
    # file -> the YAML values are used and the prediction says so
    calibration: str | None = None
