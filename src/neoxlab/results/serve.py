"""Serve run dirs -> plain records: one per serving policy and arrival gap, one per served
request.

What src/neoxlab/serve/program.py writes: summary.json (`policies`: a summary per policy and
gap, `model`, `gap_scale`) and serve_results.jsonl (every request of every policy and gap,
with its generated tokens). Older run dirs name the same records `engines` and `engine`;
those are read too. Kept apart from results.py (training steps) and free of torch, so
collecting is fast. A run that failed before writing its summary gives no rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neoxlab.results import RUN_KEYS

POLICY_FIELDS = (
    "gap_ms", "policy", "policy_model", "requests", "output_tokens", "total_s", "cpu_s",
    "tokens_per_s", "speedup", "fused_speedup", "latency_mean_s", "latency_p50_s",
    "latency_p99_s", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s",
    "avg_to_single", "fused_steps", "rows", "wasted_rows", "moves", "peak_rss_mib",
    "kv_cache_mib", "outputs_match", "repeats", "total_s_min", "total_s_max", "weights",
    "weights_source", "gap_scale",
)
REQUEST_FIELDS = (
    "gap_ms", "policy", "rid", "arrival_s", "admit_s", "first_token_s", "finish_s",
    "prompt_len", "max_new_tokens", "output_tokens", "latency_s", "ttft_s", "tpot_s",
)


def _policy(rec: dict[str, Any]) -> Any:
    """A record's policy (`engine` in older run dirs)."""
    return rec.get("policy", rec.get("engine"))


def policy_rows(summary: dict[str, Any] | None, run_row: dict[str, Any]) -> list[dict]:
    """Every policy at every gap, with `fused_speedup`: this policy's total time over
    fused's at the same gap (> 1: fused finished the trace sooner; None without fused)."""
    if not summary or summary.get("task") != "serve":
        return []
    policies = summary.get("policies", summary.get("engines")) or []
    fused_total = {r["gap_ms"]: r.get("total_s") for r in policies if _policy(r) == "fused"}
    model = summary.get("model") or {}
    rows = []
    for rec in policies:
        row = {key: run_row.get(key) for key in RUN_KEYS}
        row.update({key: rec.get(key) for key in POLICY_FIELDS})
        row["policy"] = _policy(rec)
        row["policy_model"] = rec.get("model")  # which network ran (hf_cb: a Llama twin)
        fused = fused_total.get(rec.get("gap_ms"))
        row["fused_speedup"] = rec["total_s"] / fused if fused and rec.get("total_s") else None
        row["weights"] = model.get("weights")
        row["weights_source"] = model.get("weights_source", model.get("weights"))
        row["gap_scale"] = summary.get("gap_scale")
        if model.get("tp") is not None:
            row["tp"] = model["tp"]
        rows.append(row)
    return rows


def request_rows(records: list[dict], run_row: dict[str, Any]) -> list[dict]:
    """Per-request timings (tokens themselves are left in the run dir)."""
    out = []
    for rec in records:
        row = {key: run_row.get(key) for key in RUN_KEYS}
        row.update({key: rec.get(key) for key in REQUEST_FIELDS})
        row["policy"] = _policy(rec)
        if row["output_tokens"] is None and isinstance(rec.get("tokens"), list):
            row["output_tokens"] = len(rec["tokens"])
        out.append(row)
    return out


def is_serve(run_dir: Path, cfg: dict[str, Any]) -> bool:
    return (cfg.get("task") or {}).get("name") == "serve" or (
        run_dir / "serve_results.jsonl").exists()
