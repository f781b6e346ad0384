# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# experiments: flover_*
# outputs: figures/flover_speedup.png, figures/flover_latency.png

# %% [markdown]
# # Flover: speedup of temporal fusion against the mean arrival gap, and latency spread
# Reads the newest `results/flover_sweep/*/summary.json` (every engine at each gap) and its
# `serve_results.jsonl`; writes `results/figures/flover_speedup.png` and
# `results/figures/flover_latency.png`. On CPU the gaps are nominal (scaled by gap_scale).
# TODO: read results/tables once results.py collects serve runs.

# %%
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

RESULTS = Path("results")
FIGURES = RESULTS / "figures"
run_dir = sorted((RESULTS / "flover_sweep").glob("*/summary.json"))[-1].parent
summary = pd.DataFrame(json.loads((run_dir / "summary.json").read_text())["engines"])
requests = pd.read_json(run_dir / "serve_results.jsonl", lines=True)

# %%
FIGURES.mkdir(parents=True, exist_ok=True)
fig, ax = plt.subplots(figsize=(5, 3.5))
for engine, group in summary.groupby("engine"):
    if engine != "sequential":
        ax.plot(group["gap_ms"], group["speedup"], marker="o", label=engine)
ax.axhline(1.0, color="grey", lw=0.8)
ax.set(xscale="log", xlabel="mean arrival gap (ms, nominal)",
       ylabel="speedup over sequential (total time)")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(FIGURES / "flover_speedup.png", dpi=150)

# %%
smallest = requests["gap_ms"].min()
subset = requests[requests["gap_ms"] == smallest]
fig, ax = plt.subplots(figsize=(5, 3.5))
engines = sorted(subset["engine"].unique())
ax.boxplot([subset[subset["engine"] == e]["latency_s"] for e in engines], labels=engines)
ax.set(ylabel="request latency (s)", title=f"latency at mean gap {smallest:g} ms")
ax.tick_params(axis="x", rotation=30)
fig.tight_layout()
fig.savefig(FIGURES / "flover_latency.png", dpi=150)
