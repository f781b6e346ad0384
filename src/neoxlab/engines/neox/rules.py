"""Rules for engine=neox: pure checks at validation, file checks only before submission.

validate_neox runs everywhere (it reads only the config); the checkout, the data and the
tokenizer live on the cluster, so check_neox_dir / check_neox_inputs are for the pre-submit
check on the cluster's login node.
"""

from __future__ import annotations

from pathlib import Path

from neoxlab.config import Config
from neoxlab.engines.neox.arguments import KNOWN_ARGS, TOKENIZER_TYPES
from neoxlab.engines.neox.toolchain import (
    FUSED_KERNEL_ARGS,
    MINIMUM,
    toolchain_problem,
    torch_cxx_standard,
)
from neoxlab.files import REPO_ROOT

CHAR_LEVEL_VOCAB = 512  # GPT-NeoX's CharLevelTokenizer(vocab_size=512) (megatron/tokenizer)
NEEDS_VOCAB = {"GPT2BPETokenizer", "SPMTokenizer", "HFTokenizer", "TiktokenTokenizer"}
NEEDS_MERGES = {"GPT2BPETokenizer"}
RAW_SUFFIXES = (".bin", ".idx", ".txt", ".json", ".jsonl", ".zst", ".gz", ".parquet")
# Where neoxlab's own config decides what an owned neox.yml key holds (for error messages).
OWNED_BY = {
    "num_layers": "model.num_layers", "hidden_size": "model.hidden_size",
    "num_attention_heads": "model.num_attention_heads", "seq_length": "model.seq_length",
    "max_position_embeddings": "model.max_position_embeddings",
    "rotary_pct": "model.rotary_pct", "rotary_emb_base": "model.rotary_emb_base",
    "gpt_j_residual": "model.parallel_residual", "no_weight_tying": "model.tie_embeddings",
    "layernorm_epsilon": "model.layernorm_eps", "intermediate_size": "model.ffn_mult",
    "make_vocab_size_divisible_by": "model.make_vocab_size_divisible_by",
    "model_parallel_size": "parallel.tp", "pipe_parallel_size": "parallel.pp",
    "train_micro_batch_size_per_gpu": "parallel.micro_batch",
    "gradient_accumulation_steps": "parallel.grad_accum",
    "checkpoint_activations": "parallel.activation_checkpointing",
    "optimizer": "train.lr/beta1/beta2/eps", "min_lr": "train.min_lr",
    "warmup": "train.warmup_steps", "weight_decay": "train.weight_decay",
    "gradient_clipping": "train.grad_clip", "train_iters": "train.steps",
    "lr_decay_iters": "train.steps", "seed": "train.seed", "zero_optimization": "zero.*",
    "fp16": "train.precision", "bf16": "train.precision", "data_types": "train.precision",
    "communication_data_type": "compression.communication_dtype",
    "fp32_allreduce": "compression.communication_dtype",
    "data_path": "data.path", "split": "data.val_fraction",
    "tokenizer_type": "data.tokenizer_type", "vocab_file": "data.vocab_file",
    "merge_file": "data.merge_file", "load": "the run dir", "save": "train.checkpoint_every",
    "checkpoint_factor": "train.checkpoint_every",
    "keep_last_n_checkpoints": "train.keep_checkpoints",
    "global_num_gpus": "cluster.nodes x ranks_per_node", "deepspeed_mpi": "neoxlab's entry",
    "deepspeed_slurm": "neoxlab's entry", "distributed_backend": "engine.backend",
    "use_wandb": "neoxlab (off: metrics come from the rank logs)",
    "peak_theoretical_tflops": "cluster.peak_tflops",
    # deepy.py / the launcher's own: meaningless without deepy.py.
    "train_batch_size": "parallel.micro_batch x grad_accum x dp",
    "precision": "train.precision", "user_script": "neoxlab's entry",
    "config_files": "neoxlab's entry", "world_size": "the launcher", "rank": "the launcher",
    "local_rank": "the launcher", "hostfile": "the launcher", "launcher": "the launcher",
}


def validate_neox(cfg: Config, trains: bool = True) -> list[str]:
    """engine=neox's rules, each with its fix; `trains`: the task's record says its ranks
    train (GPT-NeoX runs only its train.py)."""
    errors: list[str] = []
    c = cfg.cluster
    if c.neox_dir is None:
        errors.append(
            "engine=neox runs a GPT-NeoX checkout on the cluster but cluster.neox_dir is not "
            "set; add cluster.neox_dir=/path/to/gpt-neox (see patches/upstream.lock for the "
            "tested commit)"
        )
    if not trains:
        errors.append(
            f"engine=neox runs GPT-NeoX's train.py, so task.name must be 'train' (got "
            f"'{cfg.task.name}'); use engine=builtin for task={cfg.task.name}"
        )
    if cfg.zero.stage >= 2:
        errors.append(
            f"zero.stage={cfg.zero.stage} with engine=neox: GPT-NeoX runs every pipe_parallel_"
            "size >= 1 in DeepSpeed's pipeline engine, which refuses ZeRO-2/3; use zero.stage=1"
        )
    if cfg.zero.reduce_to_owner:
        errors.append(
            "zero.reduce_to_owner=true with engine=neox: it sets DeepSpeed's "
            "use_multi_rank_bucket_allreduce, which GPT-NeoX's DeepSpeed fork may not know; "
            "use engine=builtin or drop zero.reduce_to_owner"
        )
    errors += _data_errors(cfg)
    errors += _neox_args_errors(cfg)
    errors += _fused_kernel_errors(cfg)
    return errors


def _fused_kernel_errors(cfg: Config) -> list[str]:
    """Fused kernels asked for on a cluster whose modules cannot compile them: every rank
    would fail in GPT-NeoX's start-up JIT build, after the job has waited in the queue."""
    wanted = [key for key in FUSED_KERNEL_ARGS if cfg.engine.neox_args.get(key) is True]
    if not wanted:
        return []
    if cfg.cluster.device == "cpu":
        return [
            f"engine.neox_args.{key}=true asks for a CUDA kernel, but cluster "
            f"'{cfg.cluster.name}' has device 'cpu' (GPT-NeoX runs in CPU mode there); drop "
            f"the key (neox.yml renders it off on CPU) or pick a GPU cluster"
            for key in wanted
        ]
    standard = torch_cxx_standard()
    problem = toolchain_problem(list(cfg.cluster.modules), standard)
    if problem is None:
        return []
    least = MINIMUM[standard]
    return [
        f"engine.neox_args.{key}=true needs GPT-NeoX's fused kernels compiled on cluster "
        f"'{cfg.cluster.name}' (modules {list(cfg.cluster.modules)}), but {problem}; turn the "
        f"fusion off (engine.neox_args.{key}=false) or load newer modules (cluster.modules "
        f"with gcc >= {least['gcc'][0]} and cuda >= {least['cuda'][0]}.{least['cuda'][1]})"
        for key in wanted
    ]


def _data_errors(cfg: Config) -> list[str]:
    """data.source=stdlib: our pipeline writes the prefix (engines/neox/data.py, GPT-NeoX's
    CharLevelTokenizer, no tokenizer file); data.source=file: the user's prefix + tokenizer."""
    d = cfg.data
    if d.source == "stdlib":
        if cfg.model.vocab_size != CHAR_LEVEL_VOCAB:
            return [
                f"model.vocab_size={cfg.model.vocab_size} with engine=neox and data.source="
                f"stdlib: GPT-NeoX's CharLevelTokenizer (which reads our data) has "
                f"{CHAR_LEVEL_VOCAB} ids, so its embedding and head are that size and our "
                f"FLOPs, memory and DP/ZeRO bytes would be wrong; set model.vocab_size="
                f"{CHAR_LEVEL_VOCAB}"
            ]
        return []
    errors = []
    if d.source != "file" or not d.path:
        errors.append(
            f"engine=neox trains on GPT-NeoX's preprocessed data, but data.source='{d.source}'"
            f", data.path={d.path!r}; set data.source=stdlib (neoxlab writes the prefix) or "
            "data.source=file data.path=<prefix> (the prefix of <prefix>.bin/.idx written by "
            "GPT-NeoX's tools/datasets/preprocess_data.py)"
        )
    elif d.path.endswith(RAW_SUFFIXES):
        errors.append(
            f"data.path='{d.path}' looks like a file, not a GPT-NeoX data prefix; engine=neox "
            "needs the prefix of <prefix>.bin/.idx (run GPT-NeoX's tools/datasets/"
            "preprocess_data.py on raw text first, then give e.g. .../mydata_text_document)"
        )
    if d.tokenizer_type not in TOKENIZER_TYPES:
        errors.append(
            f"data.tokenizer_type='{d.tokenizer_type}' is not a GPT-NeoX tokenizer; use one "
            f"of {list(TOKENIZER_TYPES)}"
        )
    if d.tokenizer_type in NEEDS_VOCAB and not d.vocab_file:
        errors.append(
            f"data.tokenizer_type='{d.tokenizer_type}' needs data.vocab_file=<file> (e.g. the "
            "20B tokenizer's 20B_tokenizer.json for HFTokenizer); give the path"
        )
    if d.tokenizer_type in NEEDS_MERGES and not d.merge_file:
        errors.append("data.tokenizer_type='GPT2BPETokenizer' needs data.merge_file=<merges.txt>")
    return errors


def _neox_args_errors(cfg: Config) -> list[str]:
    errors = []
    for key in cfg.engine.neox_args:
        if key in OWNED_BY:
            errors.append(
                f"engine.neox_args.{key} is set by neoxlab from {OWNED_BY[key]}; set that "
                "instead and remove the key"
            )
        elif key not in KNOWN_ARGS:
            errors.append(
                f"engine.neox_args.{key} is not a GPT-NeoX argument (GPT-NeoX refuses unknown "
                "keys); check the spelling against megatron/neox_arguments/neox_args.py (names "
                "use underscores)"
            )
    return errors


def check_neox_dir(path: str | None) -> str | None:
    """None when path is a GPT-NeoX checkout here; otherwise the problem and its fix."""
    if path is None:
        return "cluster.neox_dir is not set; add cluster.neox_dir=/path/to/gpt-neox"
    root = Path(path).expanduser()
    root = root if root.is_absolute() else REPO_ROOT / root  # as launch.checkout_dir
    if not root.is_dir():
        return (
            f"cluster.neox_dir='{path}' ({root}) does not exist on this machine; clone "
            "GPT-NeoX there (git clone https://github.com/EleutherAI/gpt-neox, then check out "
            "the commit in patches/upstream.lock), or `make neox-checkout` to unpack the "
            "vendored one into build/gpt-neox, or fix the path"
        )
    missing = [p for p in ("train.py", "megatron/neox_arguments") if not (root / p).exists()]
    if missing:
        return (
            f"cluster.neox_dir='{path}' is not a GPT-NeoX checkout (no {', '.join(missing)}); "
            "point it at the repository root"
        )
    return None


def check_local_checkout(cfg: Config) -> list[str]:
    """The data check for ranks that run on this machine (local, emulated): the checkout is
    here (a missing one would fail every rank at start-up); not when nothing will start
    (launch.submit=false only plans)."""
    if not cfg.launch.submit or not cfg.cluster.neox_dir:
        return []
    problem = check_neox_dir(cfg.cluster.neox_dir)
    return [problem] if problem else []


def check_neox_inputs(cfg: Config) -> list[str]:
    """Before submitting: the checkout, the preprocessed data and the tokenizer files exist."""
    errors = []
    problem = check_neox_dir(cfg.cluster.neox_dir)
    if problem:
        errors.append(problem)
    d = cfg.data
    if d.path:
        missing = [s for s in (".bin", ".idx") if not Path(d.path + s).is_file()]
        if missing:
            errors.append(
                f"data.path='{d.path}' has no {' or '.join(d.path + s for s in missing)}; "
                "give the prefix GPT-NeoX's tools/datasets/preprocess_data.py wrote "
                "(e.g. .../mydata_text_document)"
            )
    for name in ("vocab_file", "merge_file"):
        value = getattr(d, name)
        if value and not Path(value).is_file():
            errors.append(f"data.{name}='{value}' does not exist; fix the path")
    return errors
