"""After a GPT-NeoX job: its rank logs -> run_dir/metrics.jsonl and summary.json.

The lines are read by neoxlab.engines.neox.logs.neox_steps (the one GPT-NeoX log reader);
throughput columns are recomputed with neoxlab.metrics (the one FLOPs definition), so
builtin and GPT-NeoX runs compare like with like. GPT-NeoX's own TFLOPS figure is kept
beside ours as neox_tflops_per_gpu.

`python -m neoxlab.engines.neox.metrics <run_dir>` runs it by hand (e.g. on a job that was killed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from neoxlab import metrics
from neoxlab.engines.neox.logs import neox_steps
from neoxlab.run import rundir

NEOX_EXTRAS = ("loss_scale", "skipped_iterations", "nan_iterations", "total_steps")


def read_log_records(run_dir: Path) -> tuple[list[dict[str, Any]], str, int]:
    """Step records of the run's rank logs (logs.neox_steps: the lowest rank that
    logged any, each step's last line), their source and the count of malformed lines."""
    records, malformed, source = neox_steps(sorted((run_dir / "logs").glob("rank*.log")))
    return records, source, len(malformed)


def iteration_flops(cfg, layout: dict[str, Any]) -> tuple[float, float]:
    """(hardware, model) FLOPs per iteration of a run's layout.json (metrics.iteration_flops)."""
    return metrics.iteration_flops(cfg, layout["tp"], layout["global_batch"])


def to_metrics_records(cfg, layout: dict[str, Any], logged: list[dict]) -> list[dict]:
    """Logged steps -> metrics.jsonl lines with the builtin engine's columns."""
    global_batch, world = layout["global_batch"], layout["world_size"]
    hardware, model_flops = iteration_flops(cfg, layout)
    out = []
    for r in logged:
        record = metrics.step_record(
            step=r["step"], iteration_s=r["iteration_s"], loss=r.get("loss"),
            lr=r.get("lr"), grad_norm=None, global_batch=global_batch,
            seq_length=cfg.model.seq_length, hardware_flops=hardware,
            model_flops=model_flops, world_size=world, peak_tflops=cfg.cluster.peak_tflops,
        )
        record["neox_tflops_per_gpu"] = r.get("tflops_per_gpu")
        record["neox_samples_per_s"] = r.get("samples_per_s")
        record.update({key: r[key] for key in NEOX_EXTRAS if key in r})
        out.append(record)
    return out


def collect_metrics(run_dir: Path) -> Path:
    """Write run_dir/metrics.jsonl (and summary.json, keeping its comm totals); return it."""
    run_dir = Path(run_dir)
    cfg = rundir.load_config(run_dir)
    layout = rundir.read_json(run_dir / "layout.json")
    logged, source, malformed = read_log_records(run_dir)
    records = to_metrics_records(cfg, layout, logged)
    path = run_dir / "metrics.jsonl"
    rundir.write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    summary_path = run_dir / "summary.json"
    summary = rundir.read_json(summary_path) if summary_path.exists() else {}
    summary.update(metrics.summarize(records, cfg.train.metrics_warmup_steps))
    summary.update(
        hardware_flops_per_iteration=iteration_flops(cfg, layout)[0],
        global_batch=layout["global_batch"], steps_source=source, malformed_lines=malformed,
    )
    rundir.write_json(summary_path, summary)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.engines.neox.metrics <run_dir>")
    print(collect_metrics(Path(sys.argv[1])))
