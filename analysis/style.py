"""Shared by every analysis notebook: paths from the environment, one colour per scheme.

figures.py passes the experiment and the directories by environment variables, so a
notebook runs the same headless and in Jupyter (where it falls back to ../results).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
BASELINE = "none"
# Paper order; colours from the Okabe-Ito palette (colour-blind safe), baseline in black.
SCHEMES = ("none", "naive", "zhybrid", "mzhybrid")
COLORS = {"none": "#000000", "naive": "#D55E00", "zhybrid": "#0072B2", "mzhybrid": "#009E73"}
LABELS = {"none": "Baseline", "naive": "Naive ZFP", "zhybrid": "ZHybrid", "mzhybrid": "MZHybrid"}
EXTRA_COLORS = ("#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#999999")
DIMS = ("dp", "zero", "tp", "pp", "other")
DIM_LABELS = {"dp": "DP gradients", "zero": "ZeRO all-gather", "tp": "Tensor parallel",
              "pp": "Pipeline p2p", "other": "Other/control"}


@dataclass(frozen=True)
class Context:
    exp: str
    results: Path
    tables: Path
    figures: Path

    def table(self, name: str) -> pd.DataFrame:
        return pd.read_parquet(self.tables / f"{self.exp}.{name}.parquet")


def setup() -> Context:
    """Apply the shared rc style and say which experiment and directories to use."""
    mpl.rc_file(HERE / "matplotlibrc")
    results = Path(os.environ.get("NEOXLAB_RESULTS", HERE.parent / "results"))
    tables = Path(os.environ.get("NEOXLAB_TABLES", results / "tables"))
    figures = Path(os.environ.get("NEOXLAB_FIGURES", results / "figures"))
    exp = os.environ.get("NEOXLAB_EXP") or sorted(tables.glob("*.runs.parquet"))[0].name.split(
        ".")[0]
    figures.mkdir(parents=True, exist_ok=True)
    return Context(exp, results, tables, figures)


def order(schemes) -> list[str]:
    """Paper order first, any other scheme after it alphabetically."""
    found = set(schemes)
    return [s for s in SCHEMES if s in found] + sorted(found - set(SCHEMES))


def color(scheme: str) -> str:
    if scheme in COLORS:
        return COLORS[scheme]
    return EXTRA_COLORS[sum(map(ord, scheme)) % len(EXTRA_COLORS)]  # stable across runs


def label(scheme: str) -> str:
    return LABELS.get(scheme, scheme)


def flops_unit(max_tflops: float) -> tuple[float, str]:
    """Scale and unit that keep FLOPS/GPU numbers readable (CPU runs are far below 1 TFLOPS)."""
    for scale, unit in ((1.0, "TFLOPS"), (1e3, "GFLOPS"), (1e6, "MFLOPS")):
        if max_tflops * scale >= 1:
            return scale, unit
    return 1e6, "MFLOPS"


def excluded_note(runs: pd.DataFrame) -> str:
    """A line naming runs left out of medians, so a failed run is never silently missing."""
    other = runs[runs["status"] != "completed"]
    if other.empty:
        return ""
    items = [f"{label(r.scheme)} on {r.gpus} GPUs: {r.status} after {r.steps_done} steps"
             for r in other.itertuples()]
    return "Not in medians: " + "; ".join(items)


def save(fig: plt.Figure, ctx: Context, name: str) -> list[Path]:
    """PNG for screens, PDF for the paper; the figure is closed so nothing piles up."""
    paths = [ctx.figures / f"{ctx.exp}.{name}.{ext}" for ext in ("png", "pdf")]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def empty(ax: plt.Axes, message: str) -> None:
    """An honest blank panel: says what is missing instead of drawing empty axes."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            color="#555555", wrap=True)


def gain_labels(ax: plt.Axes, bars, gains) -> None:
    """Each bar's % gain over baseline above it, vertical so neighbours never collide."""
    for bar, gain in zip(bars, gains, strict=True):
        if np.isfinite(gain):
            ax.annotate(f"{gain:+.1f}%", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8, rotation=90)
