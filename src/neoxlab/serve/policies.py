"""The serving policies compared on one model and trace (serve.policies): admission and row
policies of one loop, plus transformers' two runners. ("engine" in the config means the
training engine, builtin | neox; these are not engines in that sense.)

- fused: a request joins the decode batch at the next step; reordering keeps rows contiguous
- fused_noreorder: the same, but finished requests inside the range stay as wasted rows
- sequential: one request at a time
- static: FasterTransformer-style: the waiting requests form a batch that runs until its
  longest request finishes (finished rows are computed until then; nobody joins)
- dynamic: static with a batching window (wait up to window for the batch to fill)
- hf_cb: transformers' continuous batching (a separate runner, hf_cb.py; tuned by
  hf_cb_tune.py)
- hf_generate: transformers' generate, one request at a time, on the same weights
  (hf_generate.py)
"""

from __future__ import annotations

from dataclasses import dataclass

OWN_POLICIES = ("fused", "fused_noreorder", "sequential", "static", "dynamic")
HF_POLICIES = ("hf_cb", "hf_generate")  # transformers' runners, one process (TP=1)
POLICIES = OWN_POLICIES + HF_POLICIES


@dataclass(frozen=True)
class Policy:
    name: str
    reorder: bool
    max_live: int  # most requests decoded together
    batch_mode: bool  # admit only into an empty batch; compute all its rows until it ends
    window_s: float = 0.0  # batching window (dynamic)


def policy_for(name: str, max_concurrent: int, window_s: float) -> Policy:
    if name == "fused":
        return Policy(name, True, max_concurrent, False)
    if name == "fused_noreorder":
        return Policy(name, False, max_concurrent, False)
    if name == "sequential":
        return Policy(name, False, 1, False)
    if name == "static":
        return Policy(name, False, max_concurrent, True)
    if name == "dynamic":
        return Policy(name, False, max_concurrent, True, window_s)
    raise ValueError(f"policy '{name}' is not one of {list(OWN_POLICIES)}")
