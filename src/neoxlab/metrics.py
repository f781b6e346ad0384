"""The one definition of FLOPs, TFLOPS/GPU, MFU and samples/s used everywhere.

FLOPs follow GPT-NeoX's logging: 24*K*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)), with K=4 when
activations are recomputed (hardware FLOPs) and K=3 otherwise (model FLOPs).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from neoxlab.config import Config, ModelConfig
from neoxlab.layout import padded_vocab_size


def flops_per_iteration(
    model: ModelConfig, global_batch: int, padded_vocab: int, checkpointing: bool
) -> float:
    k = 4 if checkpointing else 3
    s, layers, h = model.seq_length, model.num_layers, model.hidden_size
    return (
        24 * k * global_batch * s * layers * h**2
        * (1 + s / (6 * h) + padded_vocab / (16 * layers * h))
    )


def iteration_flops(cfg: Config, tp: int, global_batch: int) -> tuple[float, float]:
    """(hardware, model) FLOPs per iteration: with and without recomputed activations."""
    vocab = padded_vocab_size(cfg.model, tp)
    return (
        flops_per_iteration(cfg.model, global_batch, vocab, cfg.parallel.activation_checkpointing),
        flops_per_iteration(cfg.model, global_batch, vocab, False),
    )


def tflops_per_gpu(flops: float, iteration_s: float, world_size: int) -> float:
    return flops / (iteration_s * world_size) / 1e12


def mfu(model_flops: float, iteration_s: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: K=3 FLOPs (no recompute) against the device's peak."""
    return tflops_per_gpu(model_flops, iteration_s, world_size) / peak_tflops


def step_record(
    *,
    step: int,
    iteration_s: float,
    loss: float,
    lr: float,
    grad_norm: float | None,
    global_batch: int,
    seq_length: int,
    hardware_flops: float,
    model_flops: float,
    world_size: int,
    peak_tflops: float,
) -> dict[str, Any]:
    """One metrics.jsonl line."""
    return {
        "step": step,
        "iteration_s": iteration_s,
        "samples_per_s": global_batch / iteration_s,
        "tokens_per_s": global_batch * seq_length / iteration_s,
        "tflops_per_gpu": tflops_per_gpu(hardware_flops, iteration_s, world_size),
        "mfu": mfu(model_flops, iteration_s, world_size, peak_tflops),
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
    }


STEADY_KEYS = ("iteration_s", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu")


def summarize(records: Iterable[dict[str, Any]], warmup_steps: int) -> dict[str, Any]:
    """Medians over steady steps (warm-up excluded), final loss and step count."""
    records = list(records)
    steady = [r for r in records if r["step"] > warmup_steps] or records
    summary: dict[str, Any] = {
        "steps": len(records),
        "steady_steps": len(steady),
        "warmup_steps_excluded": warmup_steps if len(steady) < len(records) else 0,
    }
    for key in STEADY_KEYS:
        values = [r[key] for r in steady if r.get(key) is not None]
        summary[f"median_{key}"] = statistics.median(values) if values else None
    summary["final_loss"] = records[-1]["loss"] if records else None
    return summary
