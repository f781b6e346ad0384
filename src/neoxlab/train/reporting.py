"""Rank 0's per-step outputs: metrics.jsonl, a progress bar on the terminal, wandb."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from neoxlab.config import Config


class StepReporter:
    """Writes one JSON line per step (flushed, so a crash keeps every finished step)."""

    def __init__(self, cfg: Config, run_dir: Path, terminal: TextIO | None):
        self.metrics = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self.bar = None
        if cfg.logger.progress and terminal is not None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.train.steps, file=terminal, desc=cfg.experiment, unit="step",
                dynamic_ncols=True, mininterval=0.5,
            )
        self.wandb = _start_wandb(cfg, run_dir)

    def report(self, record: dict[str, Any]) -> None:
        self.metrics.write(json.dumps(record) + "\n")
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:.2f}"
            )
            self.bar.update(1)
        if self.wandb is not None:
            self.wandb.log(
                {
                    "train/lm_loss": record["loss"],
                    "train/learning_rate": record["lr"],
                    "runtime/samples_per_sec": record["samples_per_s"],
                    "runtime/iteration_time": record["iteration_s"],
                    "runtime/tokens_per_sec": record["tokens_per_s"],
                    "runtime/flops_per_sec_per_gpu": record["tflops_per_gpu"] * 1e12,
                },
                step=record["step"],
            )

    def close(self) -> None:
        self.metrics.close()
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()


def _start_wandb(cfg: Config, run_dir: Path):
    if cfg.logger.wandb == "disabled":
        return None
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=cfg.logger.wandb_project,
        name=run_dir.name,
        group=cfg.experiment,
        dir=str(run_dir),
        mode=cfg.logger.wandb,
        config=json.loads((run_dir / "config.json").read_text()),
    )
