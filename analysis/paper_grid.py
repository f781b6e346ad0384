# %% [markdown]
# # The paper's figures: throughput against GPU count, gains, and loss curves
# TFLOPS/GPU and samples/s of the four schemes at 32-192 GPUs, their gains over the baseline
# with the published 192-GPU gains beside them (stars, labelled published), and loss curves
# per GPU count. Drawn from the grid's runs when any completed (GPT-NeoX logs of engine=neox
# runs, or neoxlab's metrics), else from the performance model's predictions of every member
# (then without loss curves: the model predicts none). Every point names its source in
# tables/{exp}.paper_points.csv (neoxlab.results.paper). A grid on CPU ranks
# (paper_grid_neox_cpu) is drawn against ranks, and says why the published gains are left out.
# experiments: paper_grid paper_grid_*
# needs runs: no
# outputs: figures/{exp}.paper.png, figures/{exp}.paper.pdf, tables/{exp}.paper_points.csv

# %%
import textwrap

import matplotlib.pyplot as plt
import style
from IPython.display import display

from neoxlab.results import paper

ctx = style.setup()
points, loss = paper.figure_data(ctx.exp, ctx.results)
ctx.tables.mkdir(parents=True, exist_ok=True)
points.to_csv(ctx.tables / f"{ctx.exp}.paper_points.csv", index=False)
display(points)

# %%
drawn = points[points["source"] != paper.PUBLISHED_SOURCE]
published = points[points["source"] == paper.PUBLISHED_SOURCE]
sources = sorted(set(drawn["source"]))
NAMES = {"neox_log": "GPT-NeoX logs", "metrics.jsonl": "neoxlab runs",
         paper.PREDICTED: "predictions of the performance model (no run yet)"}
shown_source = ", ".join(NAMES.get(s, s) for s in sources)
gpus = sorted(drawn["gpus"].unique())
schemes = style.order(drawn["scheme"])
scale, unit = style.flops_unit(drawn["tflops_per_gpu"].max())
on_cpu = any("cpu" in str(d).split("+") for d in drawn["device"])
ranks = "CPU ranks" if on_cpu else "GPUs"  # the `gpus` column is the world size
per = "rank" if on_cpu else "GPU"
note = paper.published_note(drawn)

loss_gpus = sorted(loss["gpus"].dropna().unique()) if not loss.empty else []
fig = plt.figure(figsize=(11, 11 if loss_gpus else 9))
rows = fig.subfigures(3, 1, height_ratios=[1, 1, 0.9 if loss_gpus else 0.3])
panels = [
    (rows[0], [("tflops_per_gpu", f"{unit} per {per}", scale),
               ("samples_per_s", "Throughput (samples/s)", 1.0)]),
    (rows[1], [("tflops_gain_pct", f"{unit}/{per} gain over baseline (%)", 1.0),
               ("samples_gain_pct", "samples/s gain over baseline (%)", 1.0)]),
]
for sub, cols in panels:
    axes = sub.subplots(1, 2)
    for ax, (col, ylabel, factor) in zip(axes, cols, strict=True):
        gain = col.endswith("_gain_pct")
        for scheme in schemes:
            if gain and scheme == style.BASELINE:
                continue
            here = drawn[drawn["scheme"] == scheme].sort_values("gpus")
            ax.plot(here["gpus"], here[col] * factor, marker="o", color=style.color(scheme),
                    label=style.label(scheme))
            pub = published[published["scheme"] == scheme]
            if gain and not pub.empty:
                ax.scatter(pub["gpus"], pub[col], marker="*", s=160, zorder=4,
                           color=style.color(scheme), edgecolor="black", linewidth=0.6,
                           label=f"{style.label(scheme)}, published")
                for x, y in zip(pub["gpus"], pub[col], strict=True):
                    ax.annotate(f"published {y:+.1f}%", (x, y), xytext=(-6, 6),
                                textcoords="offset points", ha="right", fontsize=8)
        if gain:
            ax.axhline(0, color="#555555", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [f"{int(n)}" for n in gpus])
        ax.minorticks_off()
        ax.set_xlabel(ranks)
        ax.set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    sub.legend(handles, labels, loc="outside right upper", title="Scheme")
rows[0].suptitle(f"{ctx.exp}: throughput against {ranks}, from {shown_source}")
rows[1].suptitle(f"gains over the baseline at the same number of {ranks}; "
                 + ("stars: the published 192-GPU gains" if note is None
                    else "\n" + "\n".join(textwrap.wrap(note, 80))))

parts = rows[2].subplots(1, max(len(loss_gpus), 1), sharey=True, squeeze=False)[0]
if not loss_gpus:
    style.empty(parts[0], "no loss curves: they need the grid's runs (GPT-NeoX logs); the "
                "performance model predicts throughput, not loss")
for ax, n in zip(parts, loss_gpus, strict=False):
    here = loss[loss["gpus"] == n]
    for scheme in style.order(here["scheme"]):
        for _, curve in here[here["scheme"] == scheme].groupby("run_id"):
            curve = curve.sort_values("step")
            ax.plot(curve["step"], curve["loss_smooth"], color=style.color(scheme),
                    lw=2.2 if scheme == style.BASELINE else 1.4, label=style.label(scheme))
    ax.set_title(f"{int(n)} {ranks}")
    ax.set_xlabel("Training step")
parts[0].set_ylabel("Training loss (smoothed)")
rows[2].suptitle("loss curves")
style.save(fig, ctx, "paper")
