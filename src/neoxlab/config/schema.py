"""Structured experiment config: the schema every composed Hydra config must fit.

Merging the composed YAML into these dataclasses rejects unknown keys and wrong types,
so a typo in an experiment file fails before anything starts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from neoxlab.config.budget_map import error_budget as error_budget_from_map
from neoxlab.config.emulated import EmulatedConfig
from neoxlab.config.profile import PerfProfile


class Dim(StrEnum):
    """The parallel dimension a collective belongs to (comm/classify.py decides by its ranks)."""

    DP = "dp"  # gradient reductions over a data-parallel rank set
    ZERO = "zero"  # ZeRO parameter all-gathers over a data-parallel rank set
    TP = "tp"
    PP = "pp"  # stage-to-stage send/recv
    OTHER = "other"  # control traffic: never compressed


DIMS = tuple(d.value for d in Dim)  # in report order
COMPRESSIBLE_DIMS = tuple(d.value for d in Dim if d is not Dim.OTHER)


@dataclass
class TaskConfig:
    name: str = "train"  # train | omb | serve | predict | tune


@dataclass
class ModelConfig:
    name: str = "neox_tiny"
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    max_position_embeddings: int = 64
    vocab_size: int = 256  # tokenizer vocabulary before padding
    make_vocab_size_divisible_by: int = 128  # padded to a multiple of this x tp
    rotary_pct: float = 0.25
    rotary_emb_base: int = 10000
    parallel_residual: bool = True
    tie_embeddings: bool = False
    ffn_mult: int = 4
    layernorm_eps: float = 1e-5
    init_std: float = 0.02


@dataclass
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int | None = None  # null: inferred as world_size / (tp * pp)
    micro_batch: int = 1
    grad_accum: int = 1
    activation_checkpointing: bool = False
    partition_method: str = "type:TransformerLayerPipe"


@dataclass
class ZeroConfig:
    stage: int = 0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    # ZeRO-1/2: reduce each gradient partition to the rank that keeps it (DeepSpeed's
    # use_multi_rank_bucket_allreduce=false) instead of all-reducing whole buckets; with DP
    # compressed, only that rank then decodes it (comm.collectives.reduce)
    reduce_to_owner: bool = False


@dataclass
class DimCompressionConfig:
    """How one parallel dimension's traffic is compressed."""

    compressor: str = "none"  # a neoxlab.compress registry name
    params: dict[str, Any] = field(default_factory=dict)
    min_bytes: int = 4096  # smaller messages pass untouched
    error_feedback: bool = False  # keep the lossy residual per bucket (dp only)
    lossless_only: bool = False  # refuse a lossy compressor on this dimension


# codecs compression=auto may switch a dimension to (each still held to tune.error_budget)
AUTO_CODECS = ("none", "zfp:rate=8", "zfp:rate=12", "zfp:rate=16", "bf16", "int8")


@dataclass
class AutoCompressionConfig:
    """compression=auto (scheme: auto): every `recheck_every` steps the builtin engine's
    measured per-dimension comm seconds are set against the performance model; when a
    dimension's link has moved out of tune.margin, that dimension is re-chosen for the link
    measured, without a restart (src/neoxlab/tune/online.py, comm/online.py, docs/tune.md)."""

    recheck_every: int = 10  # steps between re-checks (each sums the steps since the last)
    codecs: list[str] = field(default_factory=lambda: list(AUTO_CODECS))
    # the first scheme: tuned (configs/compression/tuned_<exp>.yaml when task=tune wrote one,
    # else as model) | model (the model's pick at the profile's link) | given (compression.dims)
    start: str = "tuned"
    # the link the first choice is held to: profile (the one it was made for) | measured (the
    # first re-check's estimate, no switch then: a link the profile does not describe)
    reference: str = "profile"
    # testing stand-in for a slower link on ranks whose link cannot be reshaped: from this
    # step on, every collective sleeps slow_link_s_per_mb x its MB inside its timed call
    slow_link_from_step: int | None = None
    slow_link_s_per_mb: float = 0.0


@dataclass
class CompressionConfig:
    scheme: str = "none"
    backend: str = "framework"  # framework (our wrappers) | mpi (MPI library switches)
    patch: bool = True  # wrap collectives even for `none`, to account every byte
    allreduce: str = "auto"  # auto | alltoall | allgather (compressed all-reduce algorithm)
    # dtype of DP gradient reductions (DeepSpeed communication_data_type, GPT-NeoX
    # fp32_allreduce): fp32 | fp16 | bf16; null: the training precision. fp32 reproduces the
    # paper's fp32 MPI payloads under fp16 training.
    communication_dtype: str | None = None
    dims: dict[str, DimCompressionConfig] = field(default_factory=dict)
    auto: AutoCompressionConfig = field(default_factory=AutoCompressionConfig)


@dataclass
class ClusterConfig:
    name: str = "local"
    scheduler: str = "local"  # a record of launch/schedulers.py: local, emulated, lsf, slurm
    nodes: int = 1
    # the machine's size: more cluster.nodes are refused (launch.rules); null: not known
    max_nodes: int | None = None
    ranks_per_node: int = 8  # one rank per GPU on GPU clusters
    gpus_per_node: int = 0  # devices a node has (0 on CPU-only machines)
    device: str = "cpu"
    # the compute nodes' CPU architecture: Triton (the fused GPU codecs) ships wheels for
    # x86_64 and aarch64 only; elsewhere (Lassen's POWER9: ppc64le) codecs run torch ops
    arch: str = "x86_64"
    device_memory_gib: float = 24.0
    peak_tflops: float = 0.1  # per device, used for MFU
    cores_per_node: int = 2
    launcher: str = "mpiexec"  # mpiexec | jsrun | srun
    # Site set-up before the ranks start; each value is shell-quoted into the job script.
    modules: list[str] = field(default_factory=list)  # `module load <name>` each
    activate: str | None = None  # a venv/conda activate script to source
    python: str | None = None  # interpreter on the compute nodes; null: the one planning
    env: dict[str, str] = field(default_factory=dict)  # exported before the ranks start
    neox_dir: str | None = None  # GPT-NeoX checkout for engine=neox
    queue: str | None = None  # LSF queue / Slurm partition
    account: str | None = None  # LSF bank (-G) / Slurm account
    walltime: str = "00:30"  # LSF [HH:]MM, Slurm [D-]HH:MM:SS
    mpi: str = "pmi2"  # srun --mpi plugin (pmi2 | pmix)
    # the MPI library the ranks run on; only mvapich-plus compresses on the fly
    # (compression.backend=mpi): mpich | openmpi | spectrum | mvapich2-gdr | mvapich-plus
    mpi_library: str = "mpich"
    extra: dict[str, str] = field(default_factory=dict)  # more scheduler options, name: value
    profile: PerfProfile | None = None  # hardware profile for task=predict (perfmodel)
    emulated: EmulatedConfig | None = None  # nodes and links emulated on this machine (emulated/)


@dataclass
class EngineConfig:
    name: str = "builtin"  # builtin | neox
    backend: str = "auto"  # auto | gloo | nccl
    # per parallel dimension (dp, tp): a backend other than the world's, e.g. {dp: mpi}
    # (torch groups over mpi4py, neoxlab.comm.mpi_group; ZeRO all-gathers follow dp)
    group_backends: dict[str, str] = field(default_factory=dict)
    torch_threads: int = 1
    # engine=neox only: more GPT-NeoX arguments for neox.yml (real GPT-NeoX names, e.g. fusion
    # flags, eval_iters); keys neoxlab renders from its own config are refused (set those here).
    neox_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    source: str = "stdlib"  # stdlib (Python standard library sources) | file
    path: str | None = None
    max_bytes: int = 4_000_000
    val_fraction: float = 0.05
    seed: int = 1234
    # engine=neox only: path is a GPT-NeoX preprocessed prefix (<path>.bin/.idx), tokenized by:
    tokenizer_type: str = "HFTokenizer"  # a GPT-NeoX tokenizer_type
    vocab_file: str | None = None
    merge_file: str | None = None  # GPT2BPETokenizer only


@dataclass
class LoggerConfig:
    wandb: str = "offline"  # offline | online | disabled
    wandb_project: str = "neoxlab"
    progress: bool = True


@dataclass
class TrainConfig:
    steps: int = 20
    seed: int = 1234
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 2
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | fp16 | bf16
    metrics_warmup_steps: int = 2  # excluded from the medians in summary.json
    checkpoint_every: int = 0  # steps between checkpoints; 0: none (SIGUSR1/SIGTERM still save)
    keep_checkpoints: int = 2  # newest complete checkpoints kept


@dataclass
class OmbConfig:
    """task=omb: OSU-style benchmarks run by neoxlab.omb inside the harness."""

    benchmarks: list[str] = field(default_factory=lambda: ["latency"])
    buffer: str = "numpy"
    backend: str = "mpi"  # mpi (mpi4py) | torch (torch.distributed)
    dtype: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    iterations: int | None = None
    warmup: int | None = None
    validate: bool = True
    full: bool = True
    barrier: bool = False
    compress: str | None = None
    # k > 1: the world splits into k groups (rank r in group r % k) that run every benchmark
    # at once; rank 0 reports its group. On an emulated cluster with k ranks per node, each
    # group crosses the nodes, so each uplink carries k flows, as a layout's DP groups do.
    groups: int = 1
    # true: the k groups are blocks of consecutive ranks (rank r in group r // (world / k));
    # with k = nodes each group is one node's ranks, talking inside it as TP groups do
    within_nodes: bool = False


@dataclass
class LaunchConfig:
    submit: bool = True
    timeout_s: int = 3600
    master_port: int | None = None
    comm_timeout_s: int | None = None  # a collective waits this long for a peer (null: 30 min)
    results_dir: str = "results"
    # local ranks: forkserver (fork from one process that imported the stack once) | exec
    rank_start: str = "forkserver"
    # Testing aids; they fire only in an attempt that starts from step 0 (not on resume).
    fail_rank: int | None = None  # this rank raises at fail_step
    fail_step: int = 1
    kill_during_checkpoint: int | None = None  # kill_rank SIGKILLs itself writing this step's
    kill_rank: int = 0  # checkpoint (after DeepSpeed's files, halfway through its own)
    hold_step: int | None = None  # after this step every rank waits for a stop request
    requeue: int = 0  # cluster jobs resubmit themselves up to this many times at walltime
    warn_before_s: int = 300  # the scheduler's pre-walltime signal: time left to checkpoint


@dataclass
class ServeConfig:
    """Temporal-fusion inference (task=serve): workload, serving policies and their sizing."""

    # serving policies compared side by side (serve/policies.py); not `engine`, which names
    # the training engine (builtin | neox)
    policies: list[str] = field(default_factory=lambda: [
        "fused", "fused_noreorder", "sequential", "static", "dynamic", "hf_cb", "hf_generate"])
    weights: str = "random"  # random (train.seed) | hf:<GPTNeoX dir> | run:<training run dir>
    num_requests: int = 32
    arrival: str = "poisson"  # poisson | constant
    mean_gap_ms: float = 20.0
    gaps_ms: list[float] = field(default_factory=list)  # a sweep: every policy at each gap
    gap_scale: float = 1.0  # actual gap = nominal gap x gap_scale (CPU: scale to step time)
    prompt_len_min: int = 8
    prompt_len_max: int = 16
    output_len_min: int = 16  # output lengths uniform in [min, max]; fixed when equal
    output_len_max: int = 32
    max_seq_len: int = 64  # per-slot KV cache length (prompt + output must fit)
    slots: int = 32  # preallocated request slots, each with a KV cache of max_seq_len
    max_concurrent: int | None = None  # requests decoded together; null: = slots
    sampling: str = "greedy"  # greedy | sample (per-request seed)
    temperature: float = 1.0
    top_k: int = 0  # 0: whole vocabulary
    eos_token_id: int | None = None
    seed: int = 1234  # workload and per-request sampling seeds
    batch_window_ms: float = 50.0  # dynamic batching window
    repeats: int = 1  # timed runs per policy and trace; the median total time is reported
    hf_cb_num_blocks: int = 64
    hf_cb_max_batch_tokens: int = 512
    hf_cb_page_size: int = 32
    hf_cb_tune: bool = True  # search hf_cb's sizing and CPU attention before the timed runs
    lean_decode: bool = True  # TP=1: plain torch ops on the same weights (false: megatron's)
    packed_linear: bool = True  # lean path on CPU: weights prepacked for oneDNN (8+ rows)
    packed_linear_timed: bool = True  # packed only at decode batch sizes a timed step favours
    # decode steps' attention through a C++ kernel built once per machine (fp32, CPU; SDPA
    # elsewhere, or when it cannot be built: summary.json's decode_attention says which)
    native_attention: bool = True


@dataclass
class TuneConfig:
    """task=tune: which compression per parallel dimension, chosen by the performance model
    under a loss guard (src/neoxlab/tune, docs/tune.md). The run it guards is this config's
    own (train.steps steps with the chosen scheme)."""

    dims: list[str] = field(default_factory=lambda: ["tp", "pp", "dp", "zero"])
    # compressor specs tried on every compressible dimension; empty: every registered
    # codec's own tuner candidates (compress.registry.tune_candidates), so a new codec is
    # tried without a config change
    codecs: list[str] = field(default_factory=list)
    allreduce: list[str] = field(default_factory=lambda: ["auto", "alltoall", "allgather"])
    reduce_to_owner: list[bool] = field(default_factory=lambda: [False, True])
    error_feedback: list[bool] = field(default_factory=lambda: [False, True])
    min_bytes: int = 4096  # the tuned scheme's min_bytes on every dimension
    # a dimension stays compressed only where its predicted saving exceeds margin x the
    # terms the choice trades (its communication before and after, plus its codecs)
    margin: float = 0.20
    margin_source: str = ("local model validation: six layouts within 20 % on an idle machine "
                          "(docs/measurements/2026-11-30-perfmodel-validation.md)")
    # stage (a): relative error ||x - x'|| / ||x|| a codec may cause on a dimension's tensors,
    # computed from the loss-vs-rate map's data file (config/budget_map.py); an override
    # tune.error_budget.<dim>=x replaces one dimension's
    error_budget: dict[str, float] = field(default_factory=error_budget_from_map)
    budget_source: str = ("the loss-vs-rate map (neox_tiny, TP=2 x DP=2, 3 seeds x 150 steps; "
                          "docs/measurements/data/2026-12-04-loss-rate-map.rate_map.csv, "
                          "config/budget_map.py): per dimension the largest proxy error of a "
                          "codec whose loss deviated no more than naive's codec (ZFP rate 8) "
                          "there, below every codec's that deviated more; the seed spread as "
                          "the bar let int4 on DP through and that pick deviated more than "
                          "naive on neox_small (2026-12-04-tune.md); pp, which the map has no "
                          "traffic for, takes TP's: an assumption")
    # naive's codec: a dimension's budget is at least its error on the same tensors (guard.
    # budgets: the map's budgets are neox_tiny's; naive's codec errs more on other models'
    # parameters and stays harmless); "": the map's budgets alone
    budget_reference: str = "zfp:rate=8"
    measure: bool = True  # false: predicted only (no capture, no probes; proxy on stand-ins)
    capture_tensors: int = 0  # > 0: the compression patch saves this many tensors per dimension
    capture_max_numel: int = 1 << 18  # a captured tensor's first elements kept
    warmup_steps: int = 4  # the shared checkpoint's step (the capture run's length)
    probe_steps: int = 8  # steps each probe trains after the shared checkpoint
    # noise runs: the baseline's shared checkpoint trained on uncompressed with other data
    # orders (data.seed + 1, + 2, ...) over the probes' steps: the spread a probe can show
    noise_seeds: int = 1
    noise_factor: float = 0.5  # a probe fails when it deviates > this x the noise gap
    probe_share: float = 0.10  # the probes' cost cap, as a share of the guarded run
    # the first noise run and the first probe run even over the cap (stage (b) always runs
    # when tune.measure=true; a line says so); false: what does not fit is not run
    always_probe: bool = True
    top_per_dim: int = 2  # candidates per dimension combined into schemes
    finalists: int = 3  # schemes probed at most
    # fixed schemes (configs/compression/<name>.yaml) predicted beside the pick: the paper's
    # and one per codec family the tuner may pick, on every dimension
    compare: list[str] = field(default_factory=lambda: ["none", "naive", "zhybrid",
                                                        "mzhybrid", "int8", "int4", "fp16",
                                                        "bf16", "fp8"])
    config_dir: str = "configs/compression"  # where the chosen scheme's YAML goes (repo-relative)
    run_timeout_s: int = 1800  # one capture or probe run
    # > 0: up to this many guard-passing schemes, spread over the predicted ranking (the
    # baseline and the pick always among them), as configs in <run_dir>/ranked/ (regret runs)
    export_ranked: int = 0
    # > 0: the pick and this many options predicted next slower among the guard-passing ones
    # (its nearest neighbours in the ranking), as configs in <run_dir>/ranked/ (regret runs);
    # one export at a time: export_ranked or this
    export_neighbours: int = 0


@dataclass
class Config:
    experiment: str = "local_3d"
    description: str = ""
    runs: list[str] = field(default_factory=list)  # for a comparison: experiments run in order
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    omb: OmbConfig = field(default_factory=OmbConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


class ConfigError(ValueError):
    """A config that cannot run; the message names the value, the rule and the fix."""


RENAMED_KEYS = {"serve.engines": "serve.policies"}  # old key -> its new name
# old key -> why it went: switches whose runs were slower or no faster (measured when they
# were removed, commit 13070af; docs/serving.md names them)
REMOVED_KEYS = {
    "serve.compile_decode": "decode steps on torch.compile's graphs were slower on the CPU "
                            "(fused at 8 layers, hidden 512: 600-718 against 946-1078 tok/s)",
    "serve.prefill_chunk": "chunked prefill was no faster (fused 11.8-12.1 s at 32-64 tokens "
                           "a step against 10.2-11.6 s without)",
}


def old_key_error(key: str) -> ConfigError | None:
    """The error for a key that was renamed or removed (None for any other key)."""
    if key in RENAMED_KEYS:
        return ConfigError(f"config key '{key}' was renamed '{RENAMED_KEYS[key]}' (same "
                           "values); rename it in your experiment file or override")
    if key in REMOVED_KEYS:
        return ConfigError(f"config key '{key}' was removed: {REMOVED_KEYS[key]}; delete it "
                           "from your experiment file or override")
    return None


def to_structured(raw: DictConfig | dict) -> Config:
    """Merge a composed config into the schema; unknown keys and bad types are errors."""
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, raw)
    except ConfigKeyError as exc:
        key = getattr(exc, "full_key", None) or str(exc)
        old = old_key_error(key)
        if old is not None:
            raise old from None
        raise ConfigError(
            f"unknown config key '{key}': every key must be a field of the schema in "
            f"neoxlab/config/schema.py; fix the spelling or remove it"
        ) from None
    except ValidationError as exc:
        key = getattr(exc, "full_key", "?")
        raise ConfigError(
            f"bad value for '{key}': {exc.msg if hasattr(exc, 'msg') else exc}; "
            "give a value of the declared type"
        ) from None
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def to_dict(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def from_dict(data: dict[str, Any]) -> Config:
    """A stored config (a run dir's config.json, every field written): keys renamed since it
    was written are read under their new name and removed ones are dropped, so older run
    dirs still load."""
    data = copy.deepcopy(data)
    for old, new in RENAMED_KEYS.items():
        section, key = old.split(".")
        if key in data.get(section, {}):
            new_section, new_key = new.split(".")
            data.setdefault(new_section, {}).setdefault(new_key, data[section].pop(key))
    for old in REMOVED_KEYS:
        section, key = old.split(".")
        data.get(section, {}).pop(key, None)
    return to_structured(OmegaConf.create(data))
