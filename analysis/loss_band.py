# %% [markdown]
# # Loss study: each scheme's mean loss against the baseline's seed band
# studies/loss_study.py runs every scheme with the same settings and several seeds (the
# initialisation; the data order is fixed). Lines: the mean over seeds of the smoothed loss;
# bands: min..max over seeds. Right: the difference to the baseline's mean, with the
# baseline's band around zero.
# experiments: loss_study
# outputs: figures/{exp}.loss_band.png, figures/{exp}.loss_band.pdf

# %%
import matplotlib.pyplot as plt
import pandas as pd
import style
from IPython.display import display

ctx = style.setup()
curves = pd.read_csv(ctx.tables / f"{ctx.exp}.curves.csv")
final = curves.sort_values("step").groupby(["scheme", "seed"]).tail(1)
display(final.pivot(index="seed", columns="scheme", values="loss_smooth"))

# %%
stats = curves.groupby(["scheme", "step"])["loss_smooth"].agg(["mean", "min", "max"])
base = stats.loc[style.BASELINE]
seeds = curves["seed"].nunique()
fig, axes = plt.subplots(1, 2)
for scheme in style.order(curves["scheme"]):
    s = stats.loc[scheme]
    kw = {"color": style.color(scheme)}
    axes[0].fill_between(s.index, s["min"], s["max"], alpha=0.2, lw=0, **kw)
    axes[0].plot(s.index, s["mean"], lw=1.4, label=style.label(scheme), **kw)
    if scheme == style.BASELINE:
        axes[1].fill_between(base.index, base["min"] - base["mean"],
                             base["max"] - base["mean"], alpha=0.2, lw=0, **kw)
    axes[1].plot(s.index, s["mean"] - base["mean"], lw=1.4, **kw)
axes[0].set_ylabel("Training loss (smoothed, nats/token)")
axes[1].set_ylabel("Mean loss minus the baseline's mean")
for ax in axes:
    ax.set_xlabel("Training step")
axes[1].axhline(0, color="#000000", lw=0.6)
fig.legend(loc="outside right upper", title="Scheme")
fig.suptitle(f"{ctx.exp}: mean over {seeds} seeds, band min..max")
style.save(fig, ctx, "loss_band")
