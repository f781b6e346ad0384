# %% [markdown]
# # task=tune: every candidate, the schemes, the pick
# From `<exp>.tune.parquet` (src/neoxlab/tune/report.py). Left: each candidate's predicted
# saving over the uncompressed step, per dimension, against the margin it had to clear;
# filled markers passed the guard's proxy, hollow ones did not, the chosen ones are ringed.
# Right: the predicted samples/s gain of the best schemes and of the fixed ones over the
# uncompressed step, the pick outlined.
# experiments: tune_*
# outputs: figures/{exp}.tune.png, figures/{exp}.tune.pdf

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import style
from IPython.display import display

ctx = style.setup()
tune = pd.read_parquet(ctx.tables / f"{ctx.exp}.tune.parquet")
cand = tune[tune["kind"] == "candidate"].dropna(subset=["predicted_step_s"])
schemes = tune[tune["kind"] == "scheme"]
fixed = tune[tune["kind"] == "fixed"].dropna(subset=["predicted_step_s"])
cost = tune[tune["kind"] == "cost"].set_index("label")["cost_s"]
display(schemes[["label", "predicted_step_s", "guard", "chosen"]].head(10))
display(cost)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
ax = axes[0]
dims = [d for d in ("tp", "pp", "dp", "zero") if d in set(cand["dim"])]
base_step = schemes.loc[schemes["label"] == "none", "predicted_step_s"]
base_step = float(base_step.iloc[0]) if len(base_step) else float(cand["predicted_step_s"].max())
for i, dim in enumerate(dims):
    rows = cand[cand["dim"] == dim]
    x = i + np.linspace(-0.3, 0.3, len(rows)) if len(rows) > 1 else np.array([float(i)])
    saving = rows["saving_s"].to_numpy() / base_step * 100
    margin = rows["margin_s"].to_numpy() / base_step * 100
    ok = rows["proxy_ok"].fillna(False).to_numpy(dtype=bool)
    color = style.EXTRA_COLORS[i % len(style.EXTRA_COLORS)]
    ax.scatter(x[ok], saving[ok], s=18, color=color, label=style.DIM_LABELS[dim])
    ax.scatter(x[~ok], saving[~ok], s=18, facecolor="none", edgecolor=color)
    ax.scatter(x, margin, s=8, marker="_", color="#555555")
    chosen = rows["chosen"].to_numpy(dtype=bool) & (rows["codec"] != "none").to_numpy()
    ax.scatter(x[chosen], saving[chosen], s=90, facecolor="none", edgecolor="#000000")
ax.axhline(0, color="#000000", lw=0.6)
ax.set_xticks(range(len(dims)), [style.DIM_LABELS[d] for d in dims])
ax.set_ylabel("Predicted saving, % of the uncompressed step")
ax.set_title("Candidates (dash: the margin; hollow: over the error budget)", fontsize=9)
ax.legend(fontsize=8)

ax = axes[1]
best = schemes.dropna(subset=["predicted_step_s"]).nsmallest(8, "predicted_step_s")
bars = pd.concat([best.assign(group="tuned"), fixed.assign(group="fixed")])
if bars.empty:
    style.empty(ax, "no scheme predicted")
else:
    gain = (base_step / bars["predicted_step_s"] - 1) * 100
    labels = [("chosen: " if r.chosen else "") + (r.label if r.group == "fixed"
                                                  else f"tuned {r.label}"[:44])
              for r in bars.itertuples()]
    colors = [style.color(r.label) if r.group == "fixed" else "#999999"
              for r in bars.itertuples()]
    edges = ["#000000" if r.chosen else "none" for r in bars.itertuples()]
    ax.barh(range(len(bars)), gain, color=colors, edgecolor=edges, linewidth=1.5)
    ax.axvline(0, color="#000000", lw=0.6)
    ax.set_yticks(range(len(bars)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("Predicted samples/s gain over uncompressed (%)")
    ax.set_title("Best schemes and the fixed ones (outlined: chosen)", fontsize=9)
total = cost.get("total", np.nan)
fig.suptitle(f"{ctx.exp}: task=tune (tuner wall time {total:.0f} s)")
style.save(fig, ctx, "tune")
