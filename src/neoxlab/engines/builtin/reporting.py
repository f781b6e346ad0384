"""Rank 0's per-step outputs: metrics.jsonl, progress (neoxlab.run.progress), wandb."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from neoxlab.config import Config
from neoxlab.run.progress import Progress
from neoxlab.run.rundir import write_atomic


def metrics_up_to(path: Path, step: int) -> tuple[list[dict[str, Any]], int]:
    """The records of steps 1..step (each once) and how many lines there were besides.

    Lines after `step` come from an attempt that went on past its last checkpoint; a
    resumed run recomputes those steps, so they go (as does a line cut short by a crash)."""
    if not path.exists():
        return [], 0
    kept: dict[int, dict[str, Any]] = {}
    lines = path.read_text().splitlines()
    for line in lines:
        try:
            record = json.loads(line)
            record_step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue
        if 1 <= record_step <= step and record_step not in kept:
            kept[record_step] = record
    records = [kept[s] for s in sorted(kept)]
    return records, len(lines) - len(records)


def keep_metrics_up_to(path: Path, step: int) -> tuple[list[dict[str, Any]], int]:
    """Rewrite metrics.jsonl (atomically) with only the records of steps 1..step."""
    records, dropped = metrics_up_to(path, step)
    if path.exists():
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return records, dropped


class StepReporter:
    """Writes one JSON line per step (flushed, so a crash keeps every finished step).

    A resumed run (start_step > 0) first cuts metrics.jsonl back to its checkpoint's step,
    so every step appears exactly once; `earlier` holds the records kept."""

    def __init__(self, cfg: Config, run_dir: Path, terminal: TextIO | None,
                 start_step: int = 0):
        path = run_dir / "metrics.jsonl"
        self.earlier, self.dropped = keep_metrics_up_to(path, start_step)
        self.metrics = path.open("a", buffering=1)
        self.progress = Progress(cfg.train.steps, cfg.experiment,
                                 terminal if cfg.logger.progress else None, initial=start_step)
        self.wandb = _start_wandb(cfg, run_dir)

    def report(self, record: dict[str, Any]) -> None:
        self.metrics.write(json.dumps(record) + "\n")
        self.progress.update(1, loss=f"{record['loss']:.4f}",
                             samples_s=f"{record['samples_per_s']:.2f}")
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
        self.progress.close()
        if self.wandb is not None:
            self.wandb.finish()


def _start_wandb(cfg: Config, run_dir: Path):
    if cfg.logger.wandb == "disabled":
        return None
    # deferred: wandb is slow to import and off by default
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
