# %% [markdown]
# # Summary table like the paper's
# Per scheme and GPU count: TFLOPS/GPU and samples/s (medians over steady steps of completed
# runs) with the gain over the uncompressed baseline at the same GPU count, and the final
# loss with its difference to the baseline's. Every number comes from the compare table
# that `make collect` wrote; runs left out of it are listed under the table with their status.
# experiments: * !flover_* !emulated_sweep !tune_*
# outputs: tables/{exp}.summary.md, tables/{exp}.summary.tex

# %%
import pandas as pd
import style
from IPython.display import Markdown, display

ctx = style.setup()
runs = ctx.table("runs")
compare = ctx.table("compare")
scale, unit = style.flops_unit(compare["tflops_per_gpu"].max() if len(compare) else 1.0)


# %%
def signed(value: float, digits: int) -> str:
    return "n/a" if pd.isna(value) else f"{value:+.{digits}f}"


def plain(value: float, digits: int) -> str:
    return "n/a" if pd.isna(value) else f"{value:.{digits}f}"


headers = ["Scheme", "GPUs", f"{unit}/GPU", f"{unit}/GPU gain (%)", "Samples/s",
           "Samples/s gain (%)", "Final loss", "Loss vs baseline"]
rows = []
for n in sorted(compare["gpus"].dropna().unique()):
    here = compare[compare["gpus"] == n].set_index("scheme")
    for scheme in style.order(here.index):
        r = here.loc[scheme]
        base = scheme == style.BASELINE
        rows.append([
            style.label(scheme), f"{int(n)}", plain(r["tflops_per_gpu"] * scale, 2),
            "baseline" if base else signed(r["tflops_gain_pct"], 1),
            plain(r["samples_per_s"], 2),
            "baseline" if base else signed(r["samples_gain_pct"], 1),
            plain(r["final_loss"], 3),
            "baseline" if base else signed(r["final_loss_delta"], 3),
        ])
left_out = runs[runs["status"] != "completed"]
notes = [f"{style.label(r.scheme)} on {r.gpus} GPUs ({r.run_id}): {r.status} after "
         f"{r.steps_done} steps" for r in left_out.itertuples()]

# %%
md = [f"# {ctx.exp}: schemes against the uncompressed baseline", "",
      "| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * 7) + "|"]
md += ["| " + " | ".join(row) + " |" for row in rows]
md += ["", "Medians over steady steps of completed runs; gains are (scheme / baseline - 1) x "
       "100 at the same GPU count; loss difference is final loss minus the baseline's."]
if notes:
    md += ["", "Runs not in the table:", ""] + [f"- {note}" for note in notes]
(ctx.tables / f"{ctx.exp}.summary.md").write_text("\n".join(md) + "\n")
display(Markdown("\n".join(md)))


# %%
def tex(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("%", r"\%"), ("_", r"\_"),
                          ("&", r"\&"), ("#", r"\#")):
        text = text.replace(char, escaped)
    return text


lines = [r"\begin{tabular}{llrrrrrr}", r"\toprule",
         " & ".join(tex(h) for h in headers) + r" \\", r"\midrule"]
lines += [" & ".join(tex(cell) for cell in row) + r" \\" for row in rows]
lines += [r"\bottomrule", r"\end{tabular}"]
(ctx.tables / f"{ctx.exp}.summary.tex").write_text("\n".join(lines) + "\n")
