# %% [markdown]
# # Predicted throughput per scheme against GPU count (performance model)
# The layout of the measured throughput figure (throughput.py), drawn from the
# performance model's table (`task=predict` writes `<exp>.predicted.parquet`): TFLOPS/GPU
# and samples/s per scheme with the gain over the baseline on each bar; where a measured
# comparison of the same grid exists (`paper_grid.compare.parquet`) its values sit beside
# the bars as diamonds. The lower row splits each predicted step into its components.
# experiments: predict_*
# outputs: figures/{exp}.predicted.png, figures/{exp}.predicted.pdf

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import style
from IPython.display import display

ctx = style.setup()
pred = pd.read_parquet(ctx.tables / f"{ctx.exp}.predicted.parquet")
measured_path = ctx.tables / "paper_grid.compare.parquet"
measured = pd.read_parquet(measured_path) if measured_path.exists() else pd.DataFrame()
display(pred[["experiment", "scheme", "gpus", "step_s", "tflops_per_gpu", "samples_per_s",
              "tflops_gain_pct"]])

# %%
gpus = sorted(pred["gpus"].unique())
schemes = style.order(pred["scheme"])
scale, unit = style.flops_unit(pred["tflops_per_gpu"].max())
panels = [
    ("tflops_per_gpu", "tflops_gain_pct", f"{unit} per GPU (predicted)", scale),
    ("samples_per_s", "samples_gain_pct", "Throughput (samples/s, predicted)", 1.0),
]
width = min(0.8 / max(len(schemes), 1), 0.3)

fig = plt.figure(figsize=(10, 8.4))
top, bottom_row = fig.subfigures(2, 1)
axes = top.subplots(1, 2)
for ax, (col, gain_col, ylabel, factor) in zip(axes, panels, strict=True):
    for i, scheme in enumerate(schemes):
        rows = pred[pred["scheme"] == scheme].set_index("gpus")
        offset = (i - (len(schemes) - 1) / 2) * width
        present = [n for n in gpus if n in rows.index]
        xs = [gpus.index(n) + offset for n in present]
        bars = ax.bar(xs, [rows.loc[n, col] * factor for n in present], width * 0.92,
                      color=style.color(scheme), label=style.label(scheme))
        if scheme != style.BASELINE:
            style.gain_labels(ax, bars, [rows.loc[n, gain_col] for n in present])
        if not measured.empty and col in measured:
            seen = measured[measured["scheme"] == scheme].set_index("gpus")
            here = [n for n in gpus if n in seen.index]
            ax.scatter([gpus.index(n) + offset for n in here],
                       [seen.loc[n, col] * factor for n in here], marker="D", s=18,
                       facecolor="white", edgecolor=style.color(scheme), zorder=3)
    ax.set_xticks(range(len(gpus)), [f"{int(n)}" for n in gpus])
    ax.set_xlim(-0.6, len(gpus) - 0.4)
    ax.set_xlabel("GPUs (ranks)")
    ax.set_ylabel(ylabel)
    ax.margins(y=0.18)
handles, labels = axes[0].get_legend_handles_labels()
top.legend(handles, labels, loc="outside right upper", title="Scheme")
note = "diamonds: measured (paper_grid)" if not measured.empty else "no measured grid yet"
top.suptitle(f"{ctx.exp}: predicted throughput (labels: gain over baseline; {note})")

# %%
components = ["compute", "overhead", "tp", "pp", "bubble", "dp", "zero", "codec"]
colors = dict(zip(components, ["#999999", "#CC79A7", "#0072B2", "#56B4E9", "#F0E442",
                               "#D55E00", "#E69F00", "#009E73"], strict=True))
parts = bottom_row.subplots(1, len(gpus), squeeze=False)[0]
for ax, n in zip(parts, gpus, strict=True):
    rows = pred[pred["gpus"] == n].set_index("scheme")
    order = [s for s in schemes if s in rows.index]
    bottom = np.zeros(len(order))
    for comp in components:
        values = np.array([rows.loc[s, f"{comp}_s"] for s in order])
        ax.bar(range(len(order)), values, 0.7, bottom=bottom, color=colors[comp],
               label=comp if n == gpus[0] else None)
        bottom += values
    ax.set_xticks(range(len(order)), [style.label(s) for s in order], rotation=45, ha="right")
    ax.set_title(f"{int(n)} GPUs")
parts[0].set_ylabel("Predicted step time (s)")
bottom_row.legend(loc="outside right upper", title="Component")
bottom_row.suptitle("where a predicted step goes (critical path of the busiest stage)")
style.save(fig, ctx, "predicted")
