"""Every policy on the same model and trace, side by side: warm-up + solo baseline, the
timed run, summaries, speedups and an output check against a reference policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from neoxlab.serve.hf_cb import CBSizing, hf_cb_model, run_hf_cb
from neoxlab.serve.hf_cb_tune import tune_hf_cb
from neoxlab.serve.hf_generate import neox_twin, run_hf_generate
from neoxlab.serve.model import ServeModel
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import Control, PolicyRun, Sampling, ServeLoop
from neoxlab.serve.stats import per_request, solo_timing, summarize
from neoxlab.serve.workload import Request


@dataclass(frozen=True)
class RunSettings:
    slots: int
    max_concurrent: int
    max_seq_len: int
    window_s: float
    sampling: Sampling
    cb_sizing: CBSizing
    weights: str = "random"
    seed: int = 1234
    repeats: int = 1  # timed runs per policy and trace; the one with the median total time
    cb_tune: bool = False  # search hf_cb's sizing on the first trace, then time the best


class Runner:
    def __init__(self, model: ServeModel, settings: RunSettings, control: Control | None = None):
        self.model, self.settings = model, settings
        self.control = control or Control()
        self._hf = None
        self._twin = None
        self.cb_sizing = settings.cb_sizing
        self.cb_tuning: list[dict] = []  # every hf_cb trial of the search (run dir record)

    def hf(self):
        """transformers' model for hf_cb, built on the host, on our model's device."""
        if self._hf is None:
            with torch.device("cpu"):
                model, label = hf_cb_model(self.model.config, self.settings.weights,
                                           self.settings.seed)
            self._hf = model.to(self.model.device), label
        return self._hf

    def twin(self):
        if self._twin is None:
            self._twin = neox_twin(self.model)
        return self._twin

    def tune_cb(self, requests: list[Request]) -> None:
        """Search hf_cb's sizing once, on the first trace it serves."""
        if self.settings.cb_tune and not self.cb_tuning:
            self.cb_sizing, self.cb_tuning = tune_hf_cb(
                self.hf()[0], requests, self.settings.sampling, self.settings.cb_sizing)

    def _server(self, name: str) -> tuple[Callable[[list[Request]], PolicyRun], str]:
        """(serve a list of requests under policy `name` from a fresh start, the label of the
        network that runs)."""
        s = self.settings
        if name == "hf_cb":
            model, label = self.hf()
            return (lambda reqs: run_hf_cb(model, reqs, self.cb_sizing, s.sampling)), label
        if name == "hf_generate":
            twin = self.twin()
            return ((lambda reqs: run_hf_generate(twin, reqs, s.sampling)),
                    "gpt-neox (transformers generate, same weights)")
        policy = policy_for(name, s.max_concurrent, s.window_s)
        return (lambda reqs: ServeLoop(self.model, policy, s.slots, s.max_seq_len, s.sampling,
                                       self.control).run(reqs)), "gpt-neox (ours)"

    def run_policies(self, policies: list[str], requests: list[Request]
                     ) -> dict[str, tuple[PolicyRun, dict]]:
        """Every policy warms up on the longest request alone (its timings are the solo
        baseline), then serves the trace from a fresh start, `repeats` rounds of every
        policy in turn (a stall of a shared machine hits one round, not one policy's every
        run); each policy's run with the median total time is kept."""
        if "hf_cb" in policies:
            self.tune_cb(requests)
        longest = max(requests, key=lambda r: (r.max_new_tokens, len(r.prompt)))
        solo_req = [replace(longest, arrival_s=0.0)]
        servers = {name: self._server(name) for name in policies}
        solos = {name: serve(solo_req) for name, (serve, _) in servers.items()}
        timed: dict[str, list[PolicyRun]] = {name: [] for name in policies}
        for _ in range(max(self.settings.repeats, 1)):
            for name, (serve, _) in servers.items():
                timed[name].append(serve(requests))
        out = {}
        for name, runs in timed.items():
            runs.sort(key=lambda r: r.total_s)
            run = runs[len(runs) // 2]
            summary = summarize(run, solo_timing(solos[name]))
            summary.update(model=servers[name][1], repeats=len(runs),
                           total_s_min=runs[0].total_s, total_s_max=runs[-1].total_s)
            out[name] = run, summary
        return out

    def run_all(self, policies: list[str], requests: list[Request], gap_ms: float
                ) -> tuple[list[dict], list[dict]]:
        """(summary rows, per-request rows) for every policy on this trace."""
        runs, rows = {}, []
        for name, (run, summary) in self.run_policies(policies, requests).items():
            runs[name] = run
            rows.append({"gap_ms": gap_ms, **summary})
        reference = "sequential" if "sequential" in runs else policies[0]
        ref_tokens = [r["tokens"] for r in runs[reference].records]
        base = runs.get("sequential")
        for row in rows:
            run = runs[row["policy"]]
            same_model = row["model"].startswith("gpt-neox")
            tokens = [r["tokens"] for r in run.records]
            if row["policy"] == "hf_generate" and self.settings.sampling.mode != "greedy":
                same_model = False  # it samples from torch's global generator, not ours
            row["outputs_match"] = (tokens == ref_tokens) if same_model else None
            row["requests_same"] = (sum(a == b for a, b in zip(tokens, ref_tokens, strict=True))
                                    if same_model else None)  # how many requests agree
            row["speedup"] = base.total_s / run.total_s if base and run.total_s else None
        requests_rows = [
            {"gap_ms": gap_ms, "policy": name, **rec, **per_request(rec)}
            for name, run in runs.items() for rec in run.records
        ]
        return rows, requests_rows


def ratios(rows: list[dict]) -> dict:
    """Headline ratios at each gap: fused's advantage over each baseline, and our sequential's
    tokens/s over transformers' generate (None where a policy did not run)."""
    out = {}
    for gap in sorted({r["gap_ms"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["gap_ms"] == gap}
        out[str(gap)] = {
            "fused_vs_sequential_total_time": _ratio(by, "sequential", "total_s", False),
            "fused_vs_hf_cb_throughput": _ratio(by, "hf_cb", "tokens_per_s", True),
            "fused_vs_noreorder_total_time": _ratio(by, "fused_noreorder", "total_s", False),
            # the work reordering saves: rows computed by fused_noreorder / by fused
            "noreorder_vs_fused_rows": _ratio(by, "fused_noreorder", "rows", False),
            "fused_vs_static_total_time": _ratio(by, "static", "total_s", False),
            "sequential_vs_hf_generate_tokens_per_s": _pair(by, "sequential", "hf_generate"),
        }
    return out


def _pair(by: dict[str, dict], ours: str, theirs: str) -> float | None:
    """ours' tokens/s over theirs' (> 1: ours is faster)."""
    a, b = by.get(ours), by.get(theirs)
    if not a or not b or not a["tokens_per_s"] or not b["tokens_per_s"]:
        return None
    return a["tokens_per_s"] / b["tokens_per_s"]


def _ratio(by: dict[str, dict], other: str, key: str, higher_better: bool) -> float | None:
    """fused's advantage over `other` on `key` (> 1: fused is better)."""
    f, o = by.get("fused"), by.get(other)
    if not f or not o or not f[key] or not o[key]:
        return None
    return f[key] / o[key] if higher_better else o[key] / f[key]
