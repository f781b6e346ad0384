# %% [markdown]
# # Loss curves per scheme
# Raw training loss (thin) and its debiased exponential moving average (thick), one colour
# per scheme, the uncompressed baseline drawn on top. Runs that did not complete are dotted
# and say so in the legend. One panel per GPU count.
# experiments: * !flover_* !tune_*
# outputs: figures/{exp}.loss.png, figures/{exp}.loss.pdf

# %%
import matplotlib.pyplot as plt
import style
from IPython.display import display
from matplotlib.ticker import MaxNLocator

ctx = style.setup()
steps = ctx.table("steps")
runs = ctx.table("runs")
display(runs[["run_id", "scheme", "gpus", "status", "steps_done", "final_loss"]])

# %%
gpus = sorted(runs["gpus"].dropna().unique())
fig, axes = plt.subplots(1, max(len(gpus), 1), sharey=True, squeeze=False)
entries = {}
for ax, n in zip(axes[0], gpus, strict=False):
    here = runs[runs["gpus"] == n]
    for scheme in style.order(here["scheme"]):
        base = scheme == style.BASELINE
        for run in here[here["scheme"] == scheme].itertuples():
            curve = steps[steps["run_id"] == run.run_id].sort_values("step")
            if curve.empty:
                continue
            done = run.status == "completed"
            kw = {"color": style.color(scheme), "zorder": 3 if base else 2}
            ax.plot(curve["step"], curve["loss"], lw=0.8, alpha=0.35, **kw)
            name = style.label(scheme) + ("" if done else f" ({run.status})")
            line, = ax.plot(curve["step"], curve["loss_smooth"], lw=2.6 if base else 1.6,
                            ls="-" if done else ":", **kw)
            entries.setdefault(name, line)
    ax.set_title(f"{int(n)} GPUs")
    ax.set_xlabel("Training step")
    ax.grid(axis="x")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
axes[0][0].set_ylabel("Training loss (cross-entropy, nats/token)")
if entries:
    fig.legend(list(entries.values()), list(entries.keys()), loc="outside right upper",
               title="Scheme")
else:
    for ax in axes[0]:
        style.empty(ax, "no run has logged a step yet")
fig.suptitle(f"{ctx.exp}: training loss (thin: raw, thick: smoothed)")
style.save(fig, ctx, "loss")
