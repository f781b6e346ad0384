"""Render the DeepSpeed config from our layout, ZeRO and optimizer settings."""

from __future__ import annotations

from typing import Any

from neoxlab.config import Config
from neoxlab.layout import Layout


def render(cfg: Config, layout: Layout) -> dict[str, Any]:
    t, z = cfg.train, cfg.zero
    ds: dict[str, Any] = {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "gradient_clipping": t.grad_clip,
        "steps_per_print": 10**9,  # we log ourselves; keep DeepSpeed's stdout quiet
        "wall_clock_breakdown": False,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": t.lr, "betas": [t.beta1, t.beta2], "eps": t.eps,
                "weight_decay": t.weight_decay, "torch_adam": True,
            },
        },
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": max(t.steps, t.warmup_steps + 1),
                "warmup_num_steps": t.warmup_steps,
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": t.min_lr / t.lr if t.lr else 0.0,
            },
        },
        "zero_optimization": {
            "stage": z.stage,
            "reduce_bucket_size": z.reduce_bucket_size,
            "allgather_bucket_size": z.allgather_bucket_size,
            "overlap_comm": z.overlap_comm,
            "contiguous_gradients": z.contiguous_gradients,
            "reduce_scatter": z.reduce_scatter,
        },
        "fp16": {"enabled": t.precision == "fp16", "initial_scale_power": 12,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": t.precision == "bf16"},
    }
    if z.reduce_to_owner:
        ds["zero_optimization"]["use_multi_rank_bucket_allreduce"] = False
    if communication_data_type(cfg) is not None:
        ds["communication_data_type"] = communication_data_type(cfg)
    return ds


def communication_data_type(cfg: Config) -> str | None:
    """DeepSpeed's communication_data_type as rendered: the dtype ZeRO reduces gradients in
    (None: not rendered, DeepSpeed reduces in the training precision)."""
    return cfg.compression.communication_dtype


def wire_dtypes(cfg: Config) -> dict[str, str]:
    """The dtype each dimension's payloads travel in under DeepSpeed + megatron-core:
    megatron-core's TP all-reduces, the pipeline's activations and ZeRO's parameter
    all-gathers in the training precision; DP gradients in communication_data_type."""
    precision = cfg.train.precision
    return {"tp": precision, "pp": precision, "zero": precision,
            "dp": communication_data_type(cfg) or precision}
