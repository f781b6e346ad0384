"""A serve run dir as src/neoxlab/serve/program.py leaves it, with chosen numbers, so the
tables and figures built from it can be checked against those numbers."""

from __future__ import annotations

import json
from pathlib import Path

from neoxlab.config import to_dict
from neoxlab.config.compose import compose_experiment


def write_serve_run(results: Path, exp: str, run_id: str, totals: dict[float, dict[str, float]],
                    state: str = "completed", requests: int = 3, old_names: bool = False
                    ) -> Path:
    """totals: gap ms -> policy -> total seconds. Each policy serves `requests` requests of
    4 tokens each; request r arrives at r x gap/1000 s and finishes total x (r+1)/requests.
    old_names: the records named as older run dirs name them (`engines`, `engine`)."""
    key = "engine" if old_names else "policy"
    run_dir = results / exp / run_id
    run_dir.mkdir(parents=True)
    cfg = to_dict(compose_experiment(exp, []))
    (run_dir / "config.json").write_text(json.dumps(cfg))
    (run_dir / "status.json").write_text(json.dumps({"state": state, "world_size": 1}))
    rows, lines = [], []
    for gap, by_policy in totals.items():
        for policy, total in by_policy.items():
            rows.append({
                key: policy, "gap_ms": gap, "total_s": total, "requests": requests,
                "output_tokens": 4 * requests, "tokens_per_s": 4 * requests / total,
                "speedup": by_policy["sequential"] / total, "model": "gpt-neox (ours)",
                "outputs_match": True,
            })
            for rid in range(requests):
                arrival = rid * gap / 1000
                finish = total * (rid + 1) / requests
                lines.append(json.dumps({
                    "gap_ms": gap, key: policy, "rid": rid, "arrival_s": arrival,
                    "admit_s": arrival, "first_token_s": arrival + 0.01, "finish_s": finish,
                    "prompt_len": 5, "max_new_tokens": 4, "tokens": [1, 2, 3, 4],
                    "latency_s": finish - arrival, "ttft_s": 0.01, "output_tokens": 4,
                    "tpot_s": (finish - arrival - 0.01) / 3,
                }))
    summary = {"task": "serve", "engines" if old_names else "policies": rows, "ratios": {},
               "gap_scale": 0.1,
               "model": {"layers": 6, "hidden": 256, "heads": 8, "tp": 1, "weights": "random",
                         "weights_source": "random (seed 1234)"}}
    if state == "completed":
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "serve_results.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir
