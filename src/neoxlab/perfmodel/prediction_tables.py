"""Tables of predictions: per-layout breakdown, gains over the baseline, and the comparison
with the published Lassen gains."""

from __future__ import annotations

import math

import pandas as pd

from neoxlab.perfmodel.predict import COMPONENTS, Prediction, gain_pct
from neoxlab.perfmodel.published import PUBLISHED, PUBLISHED_GPUS

BASELINE = "none"


def table(preds: list[Prediction]) -> pd.DataFrame:
    """One row per prediction, with the gain over the `none` scheme at the same model/GPUs."""
    frame = pd.DataFrame([p.row() for p in preds])
    base = frame[frame["scheme"] == BASELINE].set_index(["model", "gpus"])
    for col, gain in (("tflops_per_gpu", "tflops_gain_pct"), ("samples_per_s", "samples_gain_pct")):
        frame[gain] = [
            gain_pct(row[col], base.loc[(row["model"], row["gpus"]), col])
            if (row["model"], row["gpus"]) in base.index else math.nan
            for _, row in frame.iterrows()
        ]
    return frame


def format_table(frame: pd.DataFrame) -> str:
    cols = ["experiment", "gpus", "tp", "pp", "dp", "step_s", "tflops_per_gpu", "samples_per_s",
            "tflops_gain_pct", *[f"{c}_s" for c in COMPONENTS]]
    head = (f"{'experiment':<22}{'GPUs':>5}{'tp':>3}{'pp':>3}{'dp':>4}{'step s':>10}"
            f"{'TFLOPS/GPU':>11}{'samples/s':>11}{'gain %':>8}  "
            + " ".join(f"{c:>8}" for c in COMPONENTS))
    lines = [head, "-" * len(head)]
    for _, r in frame[cols].iterrows():
        gain = "" if math.isnan(r["tflops_gain_pct"]) else f"{r['tflops_gain_pct']:+.1f}"
        lines.append(
            f"{r['experiment']:<22}{r['gpus']:>5}{r['tp']:>3}{r['pp']:>3}{r['dp']:>4}"
            f"{_num(r['step_s']):>10}{_num(r['tflops_per_gpu']):>11}{_num(r['samples_per_s']):>11}"
            f"{gain:>8}  " + " ".join(f"{_num(r[f'{c}_s']):>8}" for c in COMPONENTS))
    lines.append("(component columns: seconds per step on the critical path; gain: TFLOPS/GPU "
                 "over the uncompressed baseline at the same GPU count)")
    return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:.4g}"


# ---- the published comparison ------------------------------------------------------------
MPI_SUFFIX = "_mvapich"  # compression.scheme of a scheme the MPI library compresses
def published_comparison(frame: pd.DataFrame) -> str | None:
    """Predicted vs published gains at the published GPU count (the sensitivity table,
    perfmodel.sensitivity, says what each assumption would have to be)."""
    # the MPI library's runs of a scheme (experiments/*_mvapich) beside ours, against the
    # same published gain
    published = frame["scheme"].str.removesuffix(MPI_SUFFIX)
    rows = frame[(frame["gpus"] == PUBLISHED_GPUS) & published.isin(PUBLISHED)]
    if rows.empty or not (frame["scheme"] == BASELINE).any():
        return None
    lines = [f"{'scheme @' + str(PUBLISHED_GPUS) + ' GPUs':<24}{'TFLOPS/GPU gain %':>34}"
             f"{'samples/s gain %':>34}",
             f"{'':<24}{'predicted':>12}{'published':>11}{'diff':>11}"
             f"{'predicted':>12}{'published':>11}{'diff':>11}"]
    for _, r in rows.iterrows():
        pub_t, pub_s = PUBLISHED[r["scheme"].removesuffix(MPI_SUFFIX)]
        lines.append(
            f"{r['experiment']:<24}{r['tflops_gain_pct']:>+12.1f}{pub_t:>+11.1f}"
            f"{r['tflops_gain_pct'] - pub_t:>+11.1f}{r['samples_gain_pct']:>+12.1f}"
            f"{pub_s:>+11.1f}{r['samples_gain_pct'] - pub_s:>+11.1f}")
    lines.append("The model predicts one iteration time, so its TFLOPS/GPU and samples/s gains "
                 "are equal; the paper's differ (see docs/perfmodel.md).")
    return "\n".join(lines)
