"""Tables of predictions: per-layout breakdown, gains over the baseline, and the comparison
with the published Lassen gains (with what would have to change to reach them)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pandas as pd

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.perfmodel.predict import COMPONENTS, Prediction, gain_pct, predict

BASELINE = "none"
# The published gains at 192 V100 (GPT-NeoX-20B, ZeRO-1, Lassen): TFLOPS/GPU and samples/s
# over the uncompressed baseline, for naive ZFP and the hybrid (ZHybrid) scheme.
PUBLISHED = {"naive": (22.5, 23.6), "zhybrid": (17.3, 12.7)}
PUBLISHED_GPUS = 192


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
KNOBS: dict[str, Callable[[PerfProfile, float], PerfProfile]] = {
    "intra-node bandwidth (TP)": lambda p, k: dataclasses.replace(
        p, intra=dataclasses.replace(p.intra, bandwidth_gbs=p.intra.bandwidth_gbs * k)),
    "inter-node bandwidth (PP, DP, ZeRO)": lambda p, k: dataclasses.replace(
        p, inter=dataclasses.replace(p.inter, bandwidth_gbs=p.inter.bandwidth_gbs * k)),
    "achievable TFLOPS": lambda p, k: dataclasses.replace(
        p, achievable_tflops=p.achievable_tflops * k),
    "zfp throughput": lambda p, k: dataclasses.replace(p, codecs={
        name: (dataclasses.replace(c, encode_gbs=c.encode_gbs * k, decode_gbs=c.decode_gbs * k)
               if name.partition(":")[0] == "zfp" else c)  # every rate's profile
        for name, c in p.codecs.items()}),
}


def published_comparison(frame: pd.DataFrame, configs: dict[str, Config],
                         profile: PerfProfile, origin: str) -> str | None:
    """Predicted vs published gains at 192 GPUs, and one sensitivity line per scheme."""
    rows = frame[(frame["gpus"] == PUBLISHED_GPUS) & frame["scheme"].isin(PUBLISHED)]
    base = frame[(frame["gpus"] == PUBLISHED_GPUS) & (frame["scheme"] == BASELINE)]
    if rows.empty or base.empty:
        return None
    base_cfg = configs[base.iloc[0]["experiment"]]
    lines = [f"{'scheme @192 GPUs':<18}{'TFLOPS/GPU gain %':>34}{'samples/s gain %':>34}",
             f"{'':<18}{'predicted':>12}{'published':>11}{'diff':>11}"
             f"{'predicted':>12}{'published':>11}{'diff':>11}"]
    sensitivity = []
    for _, r in rows.iterrows():
        pub_t, pub_s = PUBLISHED[r["scheme"]]
        lines.append(
            f"{r['experiment']:<18}{r['tflops_gain_pct']:>+12.1f}{pub_t:>+11.1f}"
            f"{r['tflops_gain_pct'] - pub_t:>+11.1f}{r['samples_gain_pct']:>+12.1f}"
            f"{pub_s:>+11.1f}{r['samples_gain_pct'] - pub_s:>+11.1f}")
        cfg = configs[r["experiment"]]
        for knob, change in KNOBS.items():
            factor = solve_factor(cfg, base_cfg, profile, change, pub_t, origin)
            shown = (f"x{factor:.3g}" if factor is not None
                     else "cannot reach it within x1/1000..x1000")
            sensitivity.append(f"  {r['experiment']}: {knob} {shown} for +{pub_t}% TFLOPS/GPU")
    lines.append("The model predicts one iteration time, so its TFLOPS/GPU and samples/s gains "
                 "are equal; the paper's differ (see docs/perfmodel.md).")
    lines.append("What one parameter would have to be multiplied by (the others as in the "
                 "profile) for the predicted gain to equal the published one:")
    return "\n".join(lines + sensitivity)


def solve_factor(cfg: Config, base_cfg: Config, profile: PerfProfile,
                 change: Callable[[PerfProfile, float], PerfProfile], target: float,
                 origin: str) -> float | None:
    """Bisection on log10(factor) in [-3, 3] for gain(factor) == target; None if no root."""
    def miss(log_k: float) -> float:
        p = change(profile, 10.0**log_k)
        ours = predict(cfg, p, origin).tflops_per_gpu
        theirs = predict(base_cfg, p, origin).tflops_per_gpu
        return gain_pct(ours, theirs) - target

    lo, hi = -3.0, 3.0
    f_lo, f_hi = miss(lo), miss(hi)
    if f_lo * f_hi > 0:
        return None
    for _ in range(50):
        mid = (lo + hi) / 2
        f_mid = miss(mid)
        if f_lo * f_mid <= 0:
            hi = mid
        else:
            lo, f_lo = mid, f_mid
    return 10.0 ** ((lo + hi) / 2)
