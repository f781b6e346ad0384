# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# experiments: flover_*
# outputs: figures/{exp}.speedup.png, figures/{exp}.speedup.pdf
# outputs: figures/{exp}.latency.png, figures/{exp}.latency.pdf

# %% [markdown]
# # Flover: where temporal fusion pays, against the mean arrival gap
# Reads `results/tables/<exp>.serve.parquet` (every policy at every gap, from `make collect`)
# and `<exp>.serve_requests.parquet` (every request), newest completed run. Left: each
# policy's speedup over sequential serving (total time for all requests); right: fused's
# advantage over each policy (that policy's total time / fused's). One gap (flover_poisson,
# flover_tp2) gives bars instead of lines. On CPU the gaps are nominal: actual = nominal x
# gap_scale. hf_cb's network is named beside its numbers (a Llama twin while transformers'
# continuous batching cannot run GPT-NeoX).

# %%
import matplotlib.pyplot as plt
import style
from IPython.display import display

ctx = style.setup()
# tables collected before the policy names call the columns engine and engine_model
OLD = {"engine": "policy", "engine_model": "policy_model"}
serve = ctx.table("serve").rename(columns=OLD)
requests = ctx.table("serve_requests").rename(columns=OLD)
done = serve[serve["status"] == "completed"]
if done.empty:
    raise RuntimeError(f"{ctx.exp}: no completed serve run in the tables; run `make run "
                     f"EXP={ctx.exp}` and `make collect EXP={ctx.exp}`")
run_id = done["run_id"].max()  # run ids start with their start time
rows = done[done["run_id"] == run_id]
reqs = requests[requests["run_id"] == run_id]
gaps = sorted(rows["gap_ms"].unique())
policies = list(dict.fromkeys(rows["policy"]))  # the order the run served them
others = [p for p in policies if p != "fused"]
scale = rows["gap_scale"].iloc[0]
# Okabe-Ito colours: ours warm, the baselines cool, one request at a time in black.
COLORS = {"fused": "#D55E00", "fused_noreorder": "#E69F00", "sequential": "#000000",
          "static": "#0072B2", "dynamic": "#56B4E9", "hf_cb": "#009E73"}
display(rows.pivot(index="gap_ms", columns="policy", values="total_s")[policies])
display(rows.pivot(index="gap_ms", columns="policy", values="fused_speedup")[others])


def panel(ax, names, column, ylabel, title):
    """Lines against the gap (a sweep), or bars (one gap)."""
    for i, name in enumerate(names):
        part = rows[rows["policy"] == name].sort_values("gap_ms")
        color = COLORS.get(name, style.color(name))
        if len(gaps) > 1:
            ax.plot(part["gap_ms"], part[column], marker="o", color=color, label=name)
        else:
            ax.bar(i, part[column].iloc[0], color=color, label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    if len(gaps) > 1:
        ax.set(xscale="log", xlabel=f"mean arrival gap (ms, nominal; actual x {scale:g})")
    else:
        ax.set_xticks(range(len(names)), names, rotation=30)
        ax.set_xlabel(f"policies at mean gap {gaps[0]:g} ms")
    ax.set(ylabel=ylabel, title=title)


# %%
fig, (left, right) = plt.subplots(1, 2)
panel(left, [p for p in policies if p != "sequential"], "speedup",
      "speedup over sequential (total time)", "every policy vs one request at a time")
panel(right, others, "fused_speedup", "total time / fused's total time",
      "fused's advantage (> 1: fused faster)")
handles, labels = left.get_legend_handles_labels()
handles2, labels2 = right.get_legend_handles_labels()
seen = dict(zip(labels + labels2, handles + handles2, strict=True))
fig.legend(seen.values(), seen.keys(), loc="outside right upper", title="Policy")
notes = sorted({f"{p}: {m}" for p, m in zip(rows["policy"], rows["policy_model"], strict=True)
                if p == "hf_cb"})
model = f"{rows['model'].iloc[0]}, tp={rows['tp'].iloc[0]}, weights {rows['weights'].iloc[0]}"
where = "against the arrival gap" if len(gaps) > 1 else f"at mean gap {gaps[0]:g} ms"
fig.suptitle(f"{ctx.exp}: temporal fusion {where} ({model})")
if notes:
    fig.supxlabel("; ".join(notes), fontsize=8, color="#555555")
style.save(fig, ctx, "speedup")

# %%
smallest = gaps[0]
subset = reqs[reqs["gap_ms"] == smallest]
fig, (lat, ttft) = plt.subplots(1, 2)
for ax, column, ylabel in ((lat, "latency_s", "request latency (s)"),
                           (ttft, "ttft_s", "time to first token (s)")):
    ax.boxplot([subset[subset["policy"] == p][column] for p in policies], tick_labels=policies)
    ax.set(ylabel=ylabel)
    ax.tick_params(axis="x", rotation=30)
fig.suptitle(f"{ctx.exp}: per-request latency at mean gap {smallest:g} ms (nominal)")
style.save(fig, ctx, "latency")
