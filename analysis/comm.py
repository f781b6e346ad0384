# %% [markdown]
# # Communication volume and where the step time goes
# Left: bytes per training step (all ranks) for each parallel dimension, before compression
# (outline) and on the wire (filled), per scheme. Right: one step of one rank split into
# communication, compression + decompression, and the rest (compute and waiting), from the
# run's accounting; communication that overlaps compute is counted as communication.
# Completed runs at one GPU count (the one with the most schemes accounted).
# experiments: * !flover_* !tune_*
# outputs: figures/{exp}.comm.png, figures/{exp}.comm.pdf

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import style
from IPython.display import display
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

ctx = style.setup()
runs = ctx.table("runs")
steps = ctx.table("steps")
bytes_cols = [f"{d}_bytes_in" for d in style.DIMS]
done = runs[(runs["status"] == "completed") & runs[bytes_cols].notna().any(axis=1)].copy()
if not done.empty:
    counts = done.groupby("gpus")["scheme"].nunique()
    gpus = max(counts.index, key=lambda n: (counts[n], n))
    done = done[done["gpus"] == gpus]


# %%
def per_scheme(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-step numbers of each completed run, then the median run of each scheme."""
    out = pd.DataFrame({"scheme": frame["scheme"]})
    for dim in style.DIMS:
        for key in ("bytes_in", "bytes_out"):
            out[f"{dim}_{key}"] = frame[f"{dim}_{key}"].astype(float) / frame["steps_done"]
    per_rank_step = frame["gpus"] * frame["steps_done"]
    cols = lambda key: [f"{d}_{key}" for d in style.DIMS]  # noqa: E731
    out["comm_s"] = frame[cols("comm_s")].astype(float).sum(axis=1) / per_rank_step
    out["codec_s"] = (frame[cols("compress_s")].astype(float).sum(axis=1)
                      + frame[cols("decompress_s")].astype(float).sum(axis=1)) / per_rank_step
    mean_iter = steps.groupby("run_id")["iteration_s"].mean()
    out["step_s"] = frame["run_id"].map(mean_iter)
    out["other_s"] = (out["step_s"] - out["comm_s"] - out["codec_s"]).clip(lower=0)
    return out.groupby("scheme").median()


table = per_scheme(done) if not done.empty else pd.DataFrame()
display(table)


# %%
def byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= scale:
            return scale, unit
    return 1.0, "B"


fig, (left, right) = plt.subplots(1, 2, width_ratios=[3, 2])
if table.empty:
    for ax in (left, right):
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no communication accounting in these runs\n(comm.jsonl / "
                "summary.json 'comm' absent)", ha="center", va="center", transform=ax.transAxes)
else:
    schemes = style.order(table.index)
    dims = [d for d in style.DIMS if table[f"{d}_bytes_in"].fillna(0).gt(0).any()]
    scale, unit = byte_unit(table[[f"{d}_bytes_in" for d in dims]].max().max())
    width = min(0.8 / len(schemes), 0.3)
    for i, scheme in enumerate(schemes):
        xs = np.arange(len(dims)) + (i - (len(schemes) - 1) / 2) * width
        before = [table.loc[scheme, f"{d}_bytes_in"] / scale for d in dims]
        after = [table.loc[scheme, f"{d}_bytes_out"] / scale for d in dims]
        left.bar(xs, before, width * 0.9, fill=False, edgecolor=style.color(scheme), lw=1)
        left.bar(xs, after, width * 0.9, color=style.color(scheme), label=style.label(scheme))
    shown = table[[f"{d}_bytes_out" for d in dims]].to_numpy(dtype=float) / scale
    if np.nanmax(shown) / max(np.nanmin(shown[shown > 0]), 1e-30) > 100:
        left.set_yscale("log")  # only when the dimensions differ by orders of magnitude
        left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        left.yaxis.set_minor_formatter(NullFormatter())
    left.set_xticks(range(len(dims)), [style.DIM_LABELS[d].replace(" ", "\n", 1) for d in dims])
    log = " (log scale)" if left.get_yscale() == "log" else ""
    left.set_ylabel(f"{unit} per training step, all ranks{log}")
    left.set_title("Bytes per dimension")
    handles, names = left.get_legend_handles_labels()
    handles.append(Patch(fill=False, edgecolor="#252525", label="outline: before compression"))
    left.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)

    parts = [("other_s", "Compute and other", "#D9D9D9", ""),
             ("comm_s", "Communication", "#636363", ""),
             ("codec_s", "Compression + decompression", "#FFFFFF", "///")]
    ys = np.arange(len(schemes))[::-1]
    starts = np.zeros(len(schemes))
    for key, name, colour, hatch in parts:
        widths = np.array([table.loc[s, key] for s in schemes]) * 1e3
        right.barh(ys, widths, left=starts, color=colour, hatch=hatch, edgecolor="#252525",
                   lw=0.6, label=name)
        starts += widths
    right.set_yticks(ys, [style.label(s) for s in schemes])
    for tick, scheme in zip(right.get_yticklabels(), schemes, strict=True):
        tick.set_color(style.color(scheme))
    right.set_xlabel("Time per step per rank (ms)")
    right.set_title("Where a step goes (mean over all steps)")
    right.grid(axis="x")
    right.grid(axis="y", visible=False)
    right.margins(x=0.05)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.suptitle(f"{ctx.exp}: communication on {int(gpus)} GPUs")
style.save(fig, ctx, "comm")
