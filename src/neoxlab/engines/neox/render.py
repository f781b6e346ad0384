"""Our experiment config -> a GPT-NeoX neox.yml (its real, underscored argument names).

Two kinds of keys:
- owned: follow from neoxlab's own model/parallel/zero/train/data/cluster settings, so the
  builtin and the neox engine run the same experiment; engine.neox_args may not set them;
- defaults: GPT-NeoX settings neoxlab has no field for, set as the published 20B config sets
  them (configs/20B.yml); engine.neox_args may change them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from neoxlab.config import Config
from neoxlab.engines.neox import data as neox_data
from neoxlab.engines.neox.toolchain import fused_kernels_default
from neoxlab.files import write_atomic
from neoxlab.layout import Layout

CHECKPOINT_DIR = "checkpoints"
# Fusions rendered off on a CPU cluster (CUDA kernels or TorchScript written for them).
CPU_OFF = ("scaled_upper_triang_masked_softmax_fusion", "scaled_masked_softmax_fusion",
           "rope_fusion", "bias_gelu_fusion", "layernorm_fusion", "rmsnorm_fusion")
NEOX_YML = "neox.yml"
SPLIT_PARTS = 1000  # `split` is written as train,valid,test parts of 1000

# GPT-NeoX settings neoxlab has no field for; engine.neox_args may change them.
DEFAULTS: dict[str, Any] = {
    "pos_emb": "rotary",
    "norm": "layernorm",
    "output_layer_parallelism": "column",
    "init_method": "small_init",
    "output_layer_init_method": "wang_init",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "checkpoint_num_layers": 1,
    "partition_activations": False,
    "synchronize_each_layer": True,
    "lr_decay_style": "cosine",
    "data_impl": "mmap",
    "eval_iters": 0,  # no evaluation passes: the builtin engine does none either
    "eval_interval": 1000,
    "log_interval": 1,  # one metrics line per step, as the builtin engine's metrics.jsonl
    "steps_per_print": 1,
    "wall_clock_breakdown": False,
}


def render_neox_config(
    cfg: Config, layout: Layout, run_dir: Path | None = None
) -> dict[str, Any]:
    """The neox.yml of a run: the owned keys, then defaults changed by engine.neox_args.

    With run_dir, checkpoints go to run_dir/checkpoints (load, and save when enabled)."""
    owned = owned_args(cfg, layout, run_dir)
    # validation refuses owned keys in neox_args
    others = {**DEFAULTS, **_fused_kernels(cfg), **cfg.engine.neox_args}
    if cfg.cluster.device == "cpu":  # CPU mode: GPT-NeoX's plain PyTorch paths only
        others.update({key: False for key in CPU_OFF})
    return {**owned, **{key: value for key, value in others.items() if key not in owned}}


def _fused_kernels(cfg: Config) -> dict[str, Any]:
    """The published 20B config's fused softmax (a C++/CUDA kernel GPT-NeoX compiles on
    every rank): on, unless the cluster's modules cannot
    compile the kernel for the installed torch (neoxlab.engines.neox.toolchain), as on Lassen
    with gcc 8 and CUDA 11. On a CPU cluster every fusion is off: they are CUDA kernels (the
    CPU mode of docs/neox.md runs GPT-NeoX's plain PyTorch paths)."""
    return {"scaled_upper_triang_masked_softmax_fusion":
            fused_kernels_default(list(cfg.cluster.modules))}


def owned_args(cfg: Config, layout: Layout, run_dir: Path | None) -> dict[str, Any]:
    """Every key that follows from neoxlab's config, in neox.yml's usual order."""
    return {
        **_model(cfg, layout),
        **_batch_and_parallel(cfg, layout),
        **_optimizer(cfg),
        "zero_optimization": _zero(cfg),
        **_precision(cfg, layout),
        **_data(cfg),
        **_checkpoints(cfg, run_dir),
        **_launcher_free(cfg, layout),
    }


def _model(cfg: Config, layout: Layout) -> dict[str, Any]:
    m = cfg.model
    out: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "seq_length": m.seq_length,
        "max_position_embeddings": m.max_position_embeddings,
        "rotary_pct": float(m.rotary_pct),
        "rotary_emb_base": m.rotary_emb_base,
        "gpt_j_residual": m.parallel_residual,
        "no_weight_tying": not m.tie_embeddings,
        "layernorm_epsilon": float(m.layernorm_eps),
        "make_vocab_size_divisible_by": m.make_vocab_size_divisible_by,
    }
    if m.ffn_mult != 4:  # GPT-NeoX's MLP is 4h unless intermediate_size says otherwise
        out["intermediate_size"] = m.ffn_mult * m.hidden_size
    return out


def _batch_and_parallel(cfg: Config, layout: Layout) -> dict[str, Any]:
    return {
        "model_parallel_size": layout.tp,
        "pipe_parallel_size": layout.pp,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "checkpoint_activations": cfg.parallel.activation_checkpointing,
    }


def _optimizer(cfg: Config) -> dict[str, Any]:
    t = cfg.train
    return {
        "optimizer": {
            "type": "Adam",
            "params": {"lr": float(t.lr), "betas": [float(t.beta1), float(t.beta2)],
                       "eps": float(t.eps)},
        },
        "min_lr": float(t.min_lr),
        # GPT-NeoX's warmup is a fraction of lr_decay_iters; ours is a step count.
        "warmup": t.warmup_steps / t.steps,
        "weight_decay": float(t.weight_decay),
        "gradient_clipping": float(t.grad_clip),
        "train_iters": t.steps,
        "lr_decay_iters": t.steps,
        "seed": t.seed,
    }


def _zero(cfg: Config) -> dict[str, Any]:
    z = cfg.zero
    return {
        "stage": z.stage,
        "allgather_partitions": True,
        "allgather_bucket_size": z.allgather_bucket_size,
        "overlap_comm": z.overlap_comm,
        "reduce_scatter": z.reduce_scatter,
        "reduce_bucket_size": z.reduce_bucket_size,
        "contiguous_gradients": z.contiguous_gradients,
    }


def communication_keys(cfg: Config) -> dict[str, Any]:
    """communication_data_type (DeepSpeed's DP gradient dtype) and fp32_allreduce (GPT-NeoX
    casts its TP all-reduces to fp32), rendered only when the scheme sets a dtype."""
    comm = cfg.compression.communication_dtype
    if comm is None:
        return {}
    return {"communication_data_type": comm, "fp32_allreduce": comm == "fp32"}


def wire_dtypes(cfg: Config) -> dict[str, str]:
    """The dtype each dimension's payloads travel in under GPT-NeoX as rendered: TP
    all-reduces in fp32 with fp32_allreduce (its mpu reduce casts up and back), DP gradients
    in communication_data_type, pipeline activations and ZeRO's parameter all-gathers in the
    training precision."""
    keys, precision = communication_keys(cfg), cfg.train.precision
    return {"tp": "fp32" if keys.get("fp32_allreduce") else precision, "pp": precision,
            "zero": precision, "dp": keys.get("communication_data_type") or precision}


def _precision(cfg: Config, layout: Layout) -> dict[str, Any]:
    """fp16 with GPT-NeoX-20B's dynamic loss scale, or bf16; fp32 renders neither. The
    scheme's communication dtype goes to DeepSpeed (communication_data_type) and, as fp32,
    to GPT-NeoX's own fp32_allreduce."""
    precision = cfg.train.precision
    out: dict[str, Any] = communication_keys(cfg)
    if precision == "fp16":
        out["fp16"] = {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 12}
    if precision == "bf16":
        out["bf16"] = {"enabled": True}
        if cfg.zero.stage > 0 and layout.pp >= 1:
            # GPT-NeoX warns that bf16 + ZeRO + pipeline breaks without fp32 accumulation.
            out["data_types"] = {"grad_accum_dtype": "fp32"}
    return out


def _data(cfg: Config) -> dict[str, Any]:
    """The user's prefix and tokenizer (data.source=file), or the prefix our pipeline writes
    for data.source=stdlib (engines/neox/data.py), read by GPT-NeoX's CharLevelTokenizer."""
    d = cfg.data
    valid = round(d.val_fraction * SPLIT_PARTS)
    split = f"{SPLIT_PARTS - valid},{valid},0"
    if neox_data.own_data(cfg):
        return {"data_path": str(neox_data.prefix_path(cfg)), "split": split,
                "tokenizer_type": neox_data.TOKENIZER}
    out: dict[str, Any] = {
        "data_path": d.path,
        "split": split,
        "tokenizer_type": d.tokenizer_type,
    }
    if d.vocab_file:
        out["vocab_file"] = d.vocab_file
    if d.merge_file:
        out["merge_file"] = d.merge_file
    return out


def _checkpoints(cfg: Config, run_dir: Path | None) -> dict[str, Any]:
    """load always (a requeued job resumes); save only with train.checkpoint_every > 0.

    GPT-NeoX saves at the end of training whenever `save` is set, which for 20B is hundreds
    of GB per run; checkpoint_every=0 means no checkpoints, so no `save` at all.
    """
    if run_dir is None:
        return {}
    path = str(Path(run_dir).resolve() / CHECKPOINT_DIR)
    out: dict[str, Any] = {"load": path}
    if cfg.train.checkpoint_every > 0:
        out.update(save=path, checkpoint_factor=cfg.train.checkpoint_every,
                   keep_last_n_checkpoints=cfg.train.keep_checkpoints)
    return out


def _launcher_free(cfg: Config, layout: Layout) -> dict[str, Any]:
    """What deepy.py would have derived: the GPU count (GPT-NeoX otherwise counts the GPUs
    of one node), and no rank discovery of its own (neoxlab's entry exports RANK etc.)."""
    backend = cfg.engine.backend
    return {
        "global_num_gpus": layout.world_size,
        "deepspeed_mpi": False,
        "deepspeed_slurm": False,
        "distributed_backend": backend if backend != "auto" else (
            "gloo" if cfg.cluster.device == "cpu" else "nccl"),
        "use_wandb": False,
        "peak_theoretical_tflops": float(cfg.cluster.peak_tflops),
    }


def owned_keys(cfg: Config, layout: Layout) -> set[str]:
    """Keys engine.neox_args may not set (they follow from neoxlab's config)."""
    return set(owned_args(cfg, layout, Path("run_dir")))


def to_yaml(values: dict[str, Any]) -> str:
    head = ("# Rendered by neoxlab from this run's config.json (neoxlab/engines/neox/render.py);\n"
            "# GPT-NeoX reads it through `python -m neoxlab.engines.neox.entry <run_dir>`.\n")
    return head + yaml.safe_dump(values, sort_keys=False, default_flow_style=False)


def write_neox_yml(cfg: Config, layout: Layout, run_dir: Path) -> Path:
    """run_dir/neox.yml, after writing our data's prefix if it is not cached yet."""
    if neox_data.own_data(cfg):
        neox_data.ensure_prefix(cfg)
    path = run_dir / NEOX_YML
    write_atomic(path, to_yaml(render_neox_config(cfg, layout, run_dir)))
    return path
