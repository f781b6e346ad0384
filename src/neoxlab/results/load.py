"""Run dirs and GPT-NeoX stdout logs -> plain records for tidy tables.

One loader for both engines, so a builtin run and a cluster GPT-NeoX run land in the same
columns and every figure compares like with like. Nothing here drops a run: failed,
running or unreadable runs come back with their status and whatever steps they logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neoxlab import metrics
from neoxlab.config import DIMS, from_dict
from neoxlab.engines.neox.logs import Malformed, neox_steps
from neoxlab.engines.registry import ENGINES
from neoxlab.layout import layout_of
from neoxlab.results import serve as serve_results

COMM_FIELDS = ("calls", "bytes_in", "bytes_out", "compress_s", "decompress_s", "comm_s")
STEP_FIELDS = (
    "step", "iteration_s", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu",
    "loss", "lr", "grad_norm",
)
# Weight of the exponential moving average behind "smoothed loss" (debiased, as TensorBoard).
SMOOTH_WEIGHT = 0.8


# ---------------------------------------------------------------- run dirs

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[Malformed]]:
    """Lines of a JSON-lines file, and the unreadable ones (a crash can cut the last)."""
    rows: list[dict[str, Any]] = []
    bad: list[Malformed] = []
    if not path.exists():
        return rows, bad
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            bad.append(Malformed(str(path), lineno, "not JSON", line.strip()))
    return rows, bad


def smooth(values: Iterable[float | None], weight: float = SMOOTH_WEIGHT) -> list[float | None]:
    """Debiased exponential moving average; gaps (None/NaN) keep the previous estimate."""
    out: list[float | None] = []
    acc = norm = 0.0
    for value in values:
        if value is not None and not math.isnan(value):
            acc = weight * acc + (1 - weight) * value
            norm = weight * norm + (1 - weight)
        out.append(acc / norm if norm else None)
    return out


def describe_compressor(dim_cfg: Any) -> str:
    """'zfp(rate=8)' from a dimension's config; 'none' when the dimension is untouched."""
    if not isinstance(dim_cfg, dict):
        return str(dim_cfg) if dim_cfg else "none"
    name = str(dim_cfg.get("compressor", "none"))
    params = dim_cfg.get("params") or {}
    if not params:
        return name
    return f"{name}(" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"


def _comm_totals(summary: dict[str, Any] | None, comm_rows: list[dict[str, Any]]) -> dict:
    """Per-dimension totals over ranks: the run's own summary if it has one, else comm.jsonl."""
    if summary and isinstance(summary.get("comm"), dict):
        return {dim: dict(vals) for dim, vals in summary["comm"].items()}
    totals: dict[str, dict[str, float]] = {}
    for row in comm_rows:
        dim = totals.setdefault(str(row.get("dim", "other")), dict.fromkeys(COMM_FIELDS, 0))
        for key in COMM_FIELDS:
            dim[key] += row.get(key) or 0
    return totals


def _layout_from(cfg: dict[str, Any]) -> dict[str, Any]:
    """layout.py's arithmetic on a run's config.json; {} when it is not a complete config."""
    try:
        lay = layout_of(from_dict(cfg))
    except Exception:  # noqa: BLE001 - a partial or older config: those columns stay empty
        return {}
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "world_size": lay.world_size,
            "global_batch": lay.global_batch}


def _config_columns(cfg: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The columns that say what was run: scheme, engine, cluster and the 3D layout."""
    par, cluster = cfg.get("parallel", {}), cfg.get("cluster", {})
    comp, model = cfg.get("compression", {}), cfg.get("model", {})
    if not layout.get("world_size"):  # no layout.json (e.g. a GPT-NeoX log given alone)
        layout = _layout_from(cfg)
    tp, pp, dp = layout.get("tp", par.get("tp")), layout.get("pp", par.get("pp")), layout.get("dp")
    world, batch = layout.get("world_size"), layout.get("global_batch")
    row = {
        "experiment": cfg.get("experiment"),
        "task": cfg.get("task", {}).get("name"),
        "scheme": comp.get("scheme", "none"),
        "backend": comp.get("backend"),
        "engine": cfg.get("engine", {}).get("name"),
        "cluster": cluster.get("name"),
        "device": cluster.get("device"),
        "model": model.get("name"),
        "gpus": world,
        "tp": tp, "pp": pp, "dp": dp,
        "zero_stage": cfg.get("zero", {}).get("stage"),
        "micro_batch": par.get("micro_batch"),
        "grad_accum": par.get("grad_accum"),
        "global_batch": batch,
        "seq_length": model.get("seq_length"),
        "steps_planned": cfg.get("train", {}).get("steps"),
    }
    dims = comp.get("dims") or {}
    for dim in DIMS[:-1]:
        row[f"compress_{dim}"] = describe_compressor(dims.get(dim))
    return row


@dataclass
class Run:
    """One run as loaded: its row for the runs table, its steps and its comm records."""

    row: dict[str, Any]
    steps: list[dict[str, Any]]
    comm: list[dict[str, Any]]
    malformed: list[Malformed]
    serve: list[dict[str, Any]] = field(default_factory=list)  # per engine and gap (serve)
    serve_requests: list[dict[str, Any]] = field(default_factory=list)  # per request (serve)


def _fill_step(record: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Every step has every column; tokens/s follows from samples/s where only that is logged."""
    out = {key: record.get(key) for key in STEP_FIELDS}
    out.update({k: v for k, v in record.items() if k not in out})
    if out["tokens_per_s"] is None and out["samples_per_s"] and row.get("seq_length"):
        out["tokens_per_s"] = out["samples_per_s"] * row["seq_length"]
    if out["samples_per_s"] is None and out["iteration_s"] and row.get("global_batch"):
        out["samples_per_s"] = row["global_batch"] / out["iteration_s"]
    return out


def _status(
    status: dict[str, Any] | None, has_summary: bool, last_step: int | None,
    planned: int | None
) -> str:
    """The recorded state; a 'completed' run with no summary or missing steps is 'incomplete'."""
    if not status:
        return "unknown"
    state = str(status.get("state", "unknown"))
    if state == "completed" and not has_summary and planned and (last_step or 0) < planned:
        return "incomplete"
    return state


def _steps_in_logs(cfg: dict[str, Any]) -> bool:
    """The run's engine record says its rank logs hold the steps (metrics.jsonl is written
    from them after the job, so it may be missing)."""
    engine = ENGINES.get(cfg.get("engine", {}).get("name", ""))
    return engine is not None and engine.steps_in_logs


def load_run(run_dir: Path, log: Path | None = None) -> Run:
    """A run dir of either engine (or a GPT-NeoX stdout log given alone) -> Run."""
    run_dir = Path(run_dir)
    cfg = _read_json(run_dir / "config.json") or {}
    layout = _read_json(run_dir / "layout.json") or {}
    status = _read_json(run_dir / "status.json")
    summary = _read_json(run_dir / "summary.json")
    row = _config_columns(cfg, layout)
    row["run_id"] = run_dir.name if log is None else log.stem
    row["run_dir"] = str(run_dir)
    if row["gpus"] is None and status:
        row["gpus"] = status.get("world_size")

    records, malformed = read_jsonl(run_dir / "metrics.jsonl")
    # an engine that writes metrics.jsonl from its own logs (engine=neox) names them in
    # summary.json: the steps come from GPT-NeoX's log, whichever file holds them now
    source = str((summary or {}).get("steps_source") or "metrics.jsonl")
    if log is not None or (not records and _steps_in_logs(cfg)):
        logs = [log] if log is not None else sorted((run_dir / "logs").glob("*.log"))
        records, bad, source = neox_steps(logs)
        malformed += bad
    steps = [_fill_step(r, row) for r in records]
    for step, loss_s in zip(steps, smooth(s["loss"] for s in steps), strict=True):
        step["loss_smooth"] = loss_s

    comm_rows, bad_comm = read_jsonl(run_dir / "comm.jsonl")
    malformed += bad_comm
    row.update(_run_metrics(cfg, summary, steps))
    row["steps_source"] = source
    row["malformed_lines"] = len(malformed)
    row["status"] = _status(status, summary is not None, row["last_step"], row["steps_planned"])
    row.update({key: (status or {}).get(key) for key in
                ("exit_code", "failed_rank", "error", "elapsed_s")})
    totals = _comm_totals(summary, comm_rows)
    for dim in DIMS:
        vals = totals.get(dim, {})
        for key in COMM_FIELDS:
            row[f"{dim}_{key}"] = vals.get(key)
    if not comm_rows and totals:
        comm_rows = [{"dim": dim, "op": None, "rank": None, **vals} for dim, vals in totals.items()]
    run = Run(row=row, steps=steps, comm=comm_rows, malformed=malformed)
    if serve_results.is_serve(run_dir, cfg):
        request_records, bad_requests = read_jsonl(run_dir / "serve_results.jsonl")
        run.malformed += bad_requests
        row["malformed_lines"] = len(run.malformed)
        run.serve = serve_results.policy_rows(summary, row)
        run.serve_requests = serve_results.request_rows(request_records, row)
    return run


def _run_metrics(cfg: dict[str, Any], summary: dict | None, steps: list[dict]) -> dict:
    """Steady-state medians: the run's own summary when present, else recomputed the same way."""
    warmup = cfg.get("train", {}).get("metrics_warmup_steps", 0)
    if summary is None:
        summary = metrics.summarize(steps, warmup) if steps else {}
    out = {f"median_{key}": summary.get(f"median_{key}") for key in metrics.STEADY_KEYS}
    out["steps_done"] = len(steps)
    out["steady_steps"] = summary.get("steady_steps")
    out["final_loss"] = summary.get("final_loss")
    out["final_loss_smooth"] = steps[-1]["loss_smooth"] if steps else None
    out["last_step"] = steps[-1]["step"] if steps else None
    return out


def find_run_dirs(root: Path) -> list[Path]:
    """Every dir under root that holds a run (config.json or status.json), sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = {p.parent for name in ("config.json", "status.json") for p in root.rglob(name)}
    return sorted(found, key=lambda p: (p.parent.name, p.name))
