# %% [markdown]
# # Where compression starts to pay: the four schemes on emulated nodes
# Gain over the uncompressed baseline (samples/s; TFLOPS/GPU gains are the same numbers: both
# divide the step's work by the same iteration time) against the uplink rate and against the
# baseline's share of its step on the inter-node wire (as the model puts it). Points:
# measured (studies/emulated_sweep.py; bars: the spread of a point's repeated runs); lines:
# the performance model with the uplink fitted from gloo all-reduce sweeps inside the
# emulated cluster (studies/emulated_model.py); dashed: the published Lassen gains; dotted: the
# communication share the model predicts for Lassen's baseline at 192 GPUs.
# experiments: emulated_sweep
# outputs: figures/{exp}.gain.png, figures/{exp}.gain.pdf

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import style
from IPython.display import display

ctx = style.setup()
sweep = pd.read_csv(ctx.tables / f"{ctx.exp}.sweep.csv")
curves_path = ctx.tables / f"{ctx.exp}.curves.csv"
curves = pd.read_csv(curves_path) if curves_path.exists() else None
lassen_path = ctx.tables / f"{ctx.exp}.lassen.json"
lassen = json.loads(lassen_path.read_text()) if lassen_path.exists() else None
model_path = ctx.tables / f"{ctx.exp}.model.csv"
model = pd.read_csv(model_path, dtype={"rate_mbit": str}) if model_path.exists() else None
# x of the right panel: the baseline's share of its step on the inter-node wire, as the
# model puts it at the point's rate (the measured share counts start-up collectives and
# waits for slower ranks too, so at fast links it is no share of a step)
model_share = {} if model is None else {
    (r.layout, r.rate_mbit): r.predicted_comm_share
    for r in model[model["scheme"] == "none"].itertuples()}
PUBLISHED = {"naive": 22.5, "zhybrid": 17.3}  # TFLOPS/GPU gains at 192 V100 (the paper)
display(sweep[["layout", "rate_mbit", "scheme", "samples_per_s", "gain_samples", "comm_share"]])

# %%
shaped = sweep["rate_mbit"].astype(str) != "none"
top = sweep.loc[shaped, "rate_mbit"].astype(float).max() if shaped.any() else 1000.0
unshaped_x = top * 3  # the unshaped links, drawn right of the fastest shaped rate
sweep["x"] = np.where(shaped, pd.to_numeric(sweep["rate_mbit"], errors="coerce"), unshaped_x)
markers = {"2x2": "o", "4x1": "s", "4x1-owner": "^"}
lines = {"2x2": "-", "4x1": "-.", "4x1-owner": ":"}  # a model curve per layout, told apart
baseline_speed = {(r.layout, str(r.rate_mbit)): r.samples_per_s
                  for r in sweep[sweep["scheme"] == style.BASELINE].itertuples()}


def gain_spread(rows: pd.DataFrame) -> np.ndarray | None:
    """Bars from the slowest to the fastest of a point's runs (studies/emulated_sweep.py
    --repeats), as gains over the baseline's median run; None for single runs."""
    if "samples_per_s_min" not in rows or rows["samples_per_s_min"].isna().all():
        return None
    base = rows.apply(lambda r: baseline_speed[(r["layout"], str(r["rate_mbit"]))], axis=1)
    mid = rows["samples_per_s"]
    return np.vstack([(mid - rows["samples_per_s_min"]) / base,
                      (rows["samples_per_s_max"] - mid) / base]).clip(min=0) * 100


fig, axes = plt.subplots(1, 2, sharey=True)
for scheme in style.order(sweep["scheme"]):
    if scheme == style.BASELINE:
        continue
    for layout, rows in sweep[sweep["scheme"] == scheme].groupby("layout"):
        kw = {"color": style.color(scheme), "marker": markers.get(layout, "^"), "ls": "none"}
        axes[0].plot(rows["x"], rows["gain_samples"] * 100, **kw,
                     label=f"{style.label(scheme)} {layout} (measured)")
        spread = gain_spread(rows)
        if spread is not None:
            axes[0].errorbar(rows["x"], rows["gain_samples"] * 100, yerr=np.nan_to_num(spread),
                             fmt="none", ecolor=style.color(scheme), lw=0.8)
        if model is not None:
            share = rows.apply(lambda r: model_share.get((r["layout"], str(r["rate_mbit"]))),
                               axis=1)
            axes[1].plot(share * 100, rows["gain_samples"] * 100, **kw)
        if curves is not None:
            c = curves[(curves["scheme"] == scheme) & (curves["layout"] == layout)]
            line = {"color": style.color(scheme), "lw": 1.2, "ls": lines.get(layout, "-")}
            axes[0].plot(c["rate_mbit"], c["gain"] * 100, **line,
                         label=f"{style.label(scheme)} {layout} (model)")
            axes[1].plot(c["baseline_comm_share"] * 100, c["gain"] * 100, **line)
    if scheme in PUBLISHED:
        for ax in axes:
            ax.axhline(PUBLISHED[scheme], color=style.color(scheme), ls="--", lw=0.8)
if lassen is not None:
    axes[1].axvline(lassen["baseline_comm_share"] * 100, color="#555555", ls=":", lw=1.2,
                    label="Lassen baseline comm share (model)")
for ax in axes:
    ax.axhline(0, color="#000000", lw=0.6)
    ax.grid(True, which="major", alpha=0.3)
axes[0].set_xscale("log")
axes[0].set_xlabel("Uplink rate per node (Mbit/s; rightmost: unshaped)")
axes[1].set_xlabel("Baseline's inter-node wire share of a step (%, model)")
axes[0].set_ylabel("Gain over baseline (samples/s = TFLOPS/GPU, %)")
handles, labels = axes[0].get_legend_handles_labels()
h1, l1 = axes[1].get_legend_handles_labels()
fig.legend(handles + h1, labels + l1, loc="outside lower center", ncol=4, fontsize=7)
fig.suptitle(f"{ctx.exp}: gain over baseline (dashed: published Lassen gains)")
style.save(fig, ctx, "gain")
