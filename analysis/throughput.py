# %% [markdown]
# # Throughput per scheme against GPU count
# TFLOPS/GPU and samples/s (medians over steady steps, completed runs only), with the gain
# over the uncompressed baseline at the same GPU count written on each bar.
# experiments: * !flover_* !emulated_sweep !tune_*
# outputs: figures/{exp}.throughput.png, figures/{exp}.throughput.pdf

# %%
import matplotlib.pyplot as plt
import style
from IPython.display import display

ctx = style.setup()
runs = ctx.table("runs")
compare = ctx.table("compare")
display(compare)

# %%
gpus = sorted(compare["gpus"].dropna().unique())
schemes = style.order(compare["scheme"])
scale, unit = style.flops_unit(compare["tflops_per_gpu"].max() if len(compare) else 1.0)
panels = [
    ("tflops_per_gpu", "tflops_gain_pct", f"{unit} per GPU", scale),
    ("samples_per_s", "samples_gain_pct", "Throughput (samples/s)", 1.0),
]
width = min(0.8 / max(len(schemes), 1), 0.3)  # a lone bar stays a bar

fig, axes = plt.subplots(1, 2)
for ax, (col, gain_col, ylabel, factor) in zip(axes, panels, strict=True):
    for i, scheme in enumerate(schemes):
        rows = compare[compare["scheme"] == scheme].set_index("gpus")
        xs = [g + (i - (len(schemes) - 1) / 2) * width
              for g, n in enumerate(gpus) if n in rows.index]
        present = [n for n in gpus if n in rows.index]
        heights = [rows.loc[n, col] * factor for n in present]
        bars = ax.bar(xs, heights, width * 0.92, color=style.color(scheme),
                      label=style.label(scheme))
        if scheme == style.BASELINE:
            continue
        style.gain_labels(ax, bars, [rows.loc[n, gain_col] for n in present])
    if compare.empty:
        style.empty(ax, "no completed run with throughput yet")
        continue
    ax.set_xticks(range(len(gpus)), [f"{int(n)}" for n in gpus])
    ax.set_xlim(-0.6, len(gpus) - 0.4)
    ax.set_xlabel("GPUs (ranks)")
    ax.set_ylabel(ylabel)
    ax.margins(y=0.18)  # room for the vertical gain labels
handles, labels = axes[0].get_legend_handles_labels()
if handles:
    fig.legend(handles, labels, loc="outside right upper", title="Scheme")
fig.suptitle(f"{ctx.exp}: throughput per scheme, median over steady steps "
             "(labels: gain over baseline)")
note = style.excluded_note(runs)
if note:
    fig.supxlabel(note, fontsize=8, color="#555555")
style.save(fig, ctx, "throughput")
