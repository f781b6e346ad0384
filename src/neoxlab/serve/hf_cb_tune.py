"""An honest hf_cb: search its sizing and CPU attention before the timed runs.

A coordinate search over a small grid (attention implementation, page size, max batch
tokens, number of blocks), each candidate timed on a probe: the trace's first requests
arriving together with outputs capped, so every candidate sees the same batched work in a
few seconds. The best throughput wins; every trial is kept for the run dir.
"""

from __future__ import annotations

from dataclasses import replace

from neoxlab.serve.hf_cb import CBSizing, run_hf_cb
from neoxlab.serve.scheduler import Sampling
from neoxlab.serve.workload import Request

ATTN = ("sdpa", "eager")
PAGE_SIZES = (16, 32, 64)
MAX_BATCH_TOKENS = (128, 256, 512, 1024)
BLOCK_SHARES = (0.5, 1.0, 2.0)  # x the blocks that hold every request of the trace at once


def blocks_for(requests: list[Request], page_size: int, share: float) -> int:
    """Blocks for `share` x every request's prompt + output at once (at least one request)."""
    pages = [-(-(len(r.prompt) + r.max_new_tokens) // page_size) for r in requests]
    return max(max(pages), round(share * sum(pages)))


def probe_of(requests: list[Request], count: int = 16, max_new: int = 32) -> list[Request]:
    return [replace(r, arrival_s=0.0, max_new_tokens=min(r.max_new_tokens, max_new))
            for r in requests[:count]]


def tune_hf_cb(model, requests: list[Request], sampling: Sampling,
               start: CBSizing) -> tuple[CBSizing, list[dict]]:
    """(best sizing for the whole trace, every trial as a dict with its probe tok/s)."""
    probe = probe_of(requests)
    tried: dict[tuple, float] = {}
    trials: list[dict] = []

    def score(attn: str, page: int, tokens: int, share: float) -> float:
        key = (attn, page, tokens, share)
        if key not in tried:
            sizing = CBSizing(blocks_for(probe, page, share), tokens, page, attn)
            run = run_hf_cb(model, probe, sizing, sampling)
            produced = sum(len(r["tokens"]) for r in run.records)
            tried[key] = produced / run.total_s
            trials.append({"attn": attn, "page_size": page, "max_batch_tokens": tokens,
                           "block_share": share, "probe_num_blocks": sizing.num_blocks,
                           "probe_tokens_per_s": tried[key]})
        return tried[key]

    best = [start.attn, start.page_size, start.max_batch_tokens, 1.0]
    for axis, values in enumerate((ATTN, PAGE_SIZES, MAX_BATCH_TOKENS, BLOCK_SHARES)):
        scores = {}
        for value in values:
            candidate = list(best)
            candidate[axis] = value
            scores[value] = score(*candidate)
        best[axis] = max(scores, key=scores.get)
    attn, page, tokens, share = best
    chosen = CBSizing(blocks_for(requests, page, share), tokens, page, attn)
    for t in trials:
        t["chosen"] = (t["attn"], t["page_size"], t["max_batch_tokens"],
                       t["block_share"]) == tuple(best)
    return chosen, trials
