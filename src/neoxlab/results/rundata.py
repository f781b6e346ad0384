"""Per-run rows for a committed data file: what a study measured, kept beside its dated
summary under docs/measurements/data/ so the summary's tables can be regenerated (each
study's `--from-data`) after its run dirs (results/, git-ignored) are gone.

A row is one run: its id and dir, the config that matters for comparing it (model, layout,
cluster, rate, compression per dimension, seeds, steps), every step's time, loss and
gradient norm, and its bytes per dimension before and after compression (summary.json's
comm totals), plus whatever labels the study adds (layout name, scheme, repeat, ...). JSON
lines: small (a few kB a run), appended run by run, so a study cut short keeps its rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neoxlab.files import write_atomic
from neoxlab.results.load import read_jsonl

COMM_KEYS = ("bytes_in", "bytes_out", "calls", "comm_s", "compress_s", "decompress_s")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def config_of(cfg: dict) -> dict[str, Any]:
    """The fields of a run's config.json that tell runs of a study apart."""
    c, p, t = cfg.get("compression", {}), cfg.get("parallel", {}), cfg.get("train", {})
    cluster = cfg.get("cluster", {})
    emulated = cluster.get("emulated") or {}
    return {
        "experiment": cfg.get("experiment"), "model": cfg.get("model", {}).get("name"),
        "tp": p.get("tp"), "pp": p.get("pp"), "micro_batch": p.get("micro_batch"),
        "grad_accum": p.get("grad_accum"), "zero_stage": cfg.get("zero", {}).get("stage"),
        "reduce_to_owner": cfg.get("zero", {}).get("reduce_to_owner"),
        "nodes": cluster.get("nodes"), "ranks_per_node": cluster.get("ranks_per_node"),
        "rate_mbit": (emulated.get("inter") or {}).get("rate_mbit"),
        "precision": t.get("precision"), "train_seed": t.get("seed"),
        "data_seed": cfg.get("data", {}).get("seed"), "steps": t.get("steps"),
        "scheme": c.get("scheme"), "allreduce": c.get("allreduce"),
        "dims": {d: {"compressor": v.get("compressor"), "params": v.get("params", {}),
                     "error_feedback": v.get("error_feedback", False)}
                 for d, v in sorted(c.get("dims", {}).items())},
    }


def run_row(run_dir: Path, **labels: Any) -> dict[str, Any]:
    """One run's row (labels first: the study's names for it)."""
    run_dir = Path(run_dir)
    records, _ = read_jsonl(run_dir / "metrics.jsonl")
    summary = _read_json(run_dir / "summary.json")
    return {
        **labels, "run_id": run_dir.name, "run_dir": str(run_dir),
        "config": config_of(_read_json(run_dir / "config.json")),
        "state": _read_json(run_dir / "status.json").get("state"),
        "steps": [r.get("step") for r in records],
        "step_s": [r.get("iteration_s") for r in records],
        "loss": [r.get("loss") for r in records],
        "grad_norm": [r.get("grad_norm") for r in records],
        "samples_per_s": [r.get("samples_per_s") for r in records],
        "bytes": {d: {k: v.get(k) for k in COMM_KEYS}
                  for d, v in sorted(summary.get("comm", {}).items())},
        "median_samples_per_s": summary.get("median_samples_per_s"),
        "median_iteration_s": summary.get("median_iteration_s"),
        "final_loss": summary.get("final_loss"),
    }


def append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Add rows to a data file; a run already there (same run_dir) is replaced."""
    path = Path(path)
    old, _ = read_jsonl(path)
    fresh = {r["run_dir"] for r in rows}
    kept = [r for r in old if r.get("run_dir") not in fresh]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r, sort_keys=False) + "\n" for r in [*kept, *rows]))


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    """A data file of these rows alone: for a study whose rows are not run dirs (timings taken
    in its own process) and that writes its file in one go."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def read(path: Path) -> list[dict[str, Any]]:
    """A data file's rows; a line that does not parse is an error naming the file."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no data file {path}; run the study with --data {path}")
    rows, bad = read_jsonl(Path(path))
    if bad:
        raise ValueError(f"{path}: {len(bad)} unreadable line(s), the first at line "
                         f"{bad[0].lineno}; fix or remove them")
    return rows
