"""Per-policy serving metrics from per-request records (times in seconds from the run start).

latency = finish - arrival; time to first token (TTFT) = first token - arrival; time per
output token (TPOT) = (finish - first token) / (tokens - 1). The average-to-single ratio
divides the mean latency by the mean latency the same requests would have alone, estimated
from one request served alone under the same policy (its TTFT + (n - 1) x its TPOT).
"""

from __future__ import annotations

import statistics

from neoxlab.serve.scheduler import PolicyRun


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def per_request(rec: dict) -> dict:
    n = len(rec["tokens"])
    return {
        "latency_s": rec["finish_s"] - rec["arrival_s"],
        "ttft_s": rec["first_token_s"] - rec["arrival_s"],
        "tpot_s": (rec["finish_s"] - rec["first_token_s"]) / (n - 1) if n > 1 else None,
        "output_tokens": n,
    }


def solo_timing(run: PolicyRun) -> tuple[float, float]:
    """(TTFT, TPOT) of a one-request run, the baseline of the average-to-single ratio."""
    (rec,) = run.records
    m = per_request(rec)
    return m["ttft_s"], m["tpot_s"] or 0.0


def summarize(run: PolicyRun, solo: tuple[float, float] | None = None) -> dict:
    reqs = [per_request(r) for r in run.records]
    lat = [r["latency_s"] for r in reqs]
    ttft = [r["ttft_s"] for r in reqs]
    tpot = [r["tpot_s"] for r in reqs if r["tpot_s"] is not None]
    tokens = sum(r["output_tokens"] for r in reqs)
    out = {
        "policy": run.policy, "requests": len(reqs), "output_tokens": tokens,
        "total_s": run.total_s, "cpu_s": run.cpu_s,
        "tokens_per_s": tokens / run.total_s if run.total_s else None,
        "latency_mean_s": statistics.fmean(lat), "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99), "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": statistics.fmean(tpot) if tpot else None,
        "fused_steps": run.steps, "rows": run.rows, "wasted_rows": run.wasted_rows,
        "moves": run.moves,
        "peak_rss_mib": run.peak_rss_bytes / 2**20, "kv_cache_mib": run.kv_cache_bytes / 2**20,
        "avg_to_single": None,
    }
    if solo is not None:
        single = [solo[0] + (r["output_tokens"] - 1) * solo[1] for r in reqs]
        out["avg_to_single"] = statistics.fmean(lat) / statistics.fmean(single)
    return out


COLUMNS = (
    ("policy", "policy", "{}"), ("gap_ms", "gap ms", "{:g}"), ("total_s", "total s", "{:.2f}"),
    ("cpu_s", "cpu s", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"), ("speedup", "x seq", "{:.2f}"),
    ("latency_mean_s", "lat mean", "{:.3f}"), ("latency_p50_s", "p50", "{:.3f}"),
    ("latency_p99_s", "p99", "{:.3f}"), ("ttft_mean_s", "ttft", "{:.3f}"),
    ("tpot_mean_s", "tpot ms", "{:.2f}"), ("avg_to_single", "avg/1", "{:.2f}"),
    ("fused_steps", "steps", "{}"), ("rows", "rows", "{}"), ("wasted_rows", "wasted", "{}"),
    ("moves", "moves", "{}"),
    ("peak_rss_mib", "rss MiB", "{:.0f}"), ("outputs_match", "same", "{}"),
    ("requests_same", "same n", "{}"),
)


def format_table(rows: list[dict]) -> str:
    """A fixed-width table of policy summaries (missing values shown as '-')."""
    def cell(row: dict, key: str, fmt: str) -> str:
        value = row.get(key)
        if value is None:
            return "-"
        if key == "tpot_mean_s":
            value *= 1000
        return fmt.format(value)

    table = [[title for _, title, _ in COLUMNS]]
    table += [[cell(r, key, fmt) for key, _, fmt in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in table]
    notes = sorted({f"{r['policy']}: {r['model']}" for r in rows if r.get("model")})
    return "\n".join(lines + notes)
