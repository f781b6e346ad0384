# %% [markdown]
# # The loss-vs-rate map: where compressing one dimension starts to hurt the loss
# studies/loss_rate_map.py compresses one dimension at a time (ZFP rates 2, 4, 8 and int4 in
# fp32; ZFP rates 4 and 8 in bf16) on the loss study's layout, seed by seed. Points: the mean
# |loss - the same-seed baseline| over the second half of training, mean over seeds; dashed:
# the baseline's own seed spread over the same steps, for scale. A codec hurts above naive's
# codec (ZFP rate 8) on the same dimension: the bar task=tune's budgets come from.
# experiments: loss_rate_map
# needs runs: no
# outputs: figures/{exp}.rate_map.png, figures/{exp}.rate_map.pdf

# %%
import matplotlib.pyplot as plt
import pandas as pd
import style
from IPython.display import display

ctx = style.setup()
path = ctx.tables / f"{ctx.exp}.rate_map.csv"
table = pd.read_csv(path) if path.exists() else pd.DataFrame()
if not table.empty:
    display(table)

# %%
ORDER = ["zfp:rate=2", "zfp:rate=4", "zfp:rate=8", "int4"]
precisions = list(dict.fromkeys(table["precision"])) if not table.empty else ["fp32"]
fig, axes = plt.subplots(1, len(precisions), squeeze=False, figsize=(5 * len(precisions), 4))
for ax, precision in zip(axes[0], precisions, strict=True):
    rows = table[table["precision"] == precision] if not table.empty else table
    if rows.empty:
        style.empty(ax, "no finished map yet: run studies/loss_rate_map.py")
        continue
    codecs = [c for c in ORDER if c in set(rows["codec"])]
    for i, dim in enumerate(dict.fromkeys(rows["dim"])):
        mine = rows[rows["dim"] == dim].set_index("codec").reindex(codecs)
        ax.plot(range(len(codecs)), mine["deviation"], marker="o",
                color=style.EXTRA_COLORS[i % len(style.EXTRA_COLORS)],
                label=style.DIM_LABELS.get(dim, dim))
    ax.axhline(rows["seed_spread"].iloc[0], color="#000000", ls="--", lw=0.8,
               label="baseline seed spread")
    ax.set_xticks(range(len(codecs)), codecs)
    ax.set_yscale("log")
    ax.set_title(precision)
    ax.set_ylabel("Mean |loss - same-seed baseline|, second half")
axes[0][0].legend(fontsize=8)
fig.suptitle(f"{ctx.exp}: loss deviation per dimension and rate")
style.save(fig, ctx, "rate_map")
