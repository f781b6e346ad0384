"""The sensitivity table of a comparison at the published GPU count, as text (printed and
written to <results>/tables/<exp>.sensitivity.md) and as a table (.csv): every row's gains,
what each assumption alone would need, how every input is known, and the share of the
published gains the best-supported prediction reaches."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from neoxlab.config import Config
from neoxlab.config.profile import PerfProfile
from neoxlab.perfmodel import sensitivity as sens
from neoxlab.perfmodel import what_ifs
from neoxlab.perfmodel.published import PUBLISHED_GPUS, TARGETS
from neoxlab.perfmodel.resolve import profile_value
from neoxlab.results.tables import write_table
from neoxlab.run import rundir

# inputs of the base case that come from the experiment configs, and how they are known
CONFIG_INPUTS = (
    ("GPT-NeoX-20B's shape (44 layers, hidden 6144, vocabulary 50432)",
     "published: GPT-NeoX configs/20B.yml"),
    ("training precision fp16", "published: GPT-NeoX configs/20B.yml"),
    ("ZeRO-1 with 1.26e9-element buckets", "published: GPT-NeoX configs/20B.yml"),
    ("micro batch 4 x accumulation 32 (global batch 1536)",
     "published: GPT-NeoX configs/20B.yml (on 96 GPUs)"),
    ("layout TP 4 x PP 4 x DP 12 on 192 GPUs",
     "assumed: ours (experiments/baseline_192gpu.yaml says why)"),
    ("schemes: ZFP rate 8 (naive; DP of both hybrids), rate 24 (ZHybrid elsewhere), MPC "
     "(MZHybrid elsewhere)", "assumed: configs/compression/ (the schemes are published; these "
     "rates are not checked against the paper)"),
)
TARGET_LABEL = {"tflops": "TFLOPS/GPU", "samples": "samples/s"}


def base_case(frame: pd.DataFrame, configs: dict[str, Config], profile: PerfProfile
              ) -> sens.Case | None:
    """The comparison's members at the published GPU count, by scheme; None without a
    baseline and the published schemes there."""
    here = frame[frame["gpus"] == PUBLISHED_GPUS]
    by_scheme = {r["scheme"]: configs[r["experiment"]] for _, r in here.iterrows()}
    wanted = {sens.BASELINE, *(scheme for scheme, _, _ in TARGETS)}
    if not wanted <= set(by_scheme):
        return None
    keep = {s: c for s, c in by_scheme.items() if s in (sens.BASELINE, *sens.SCHEMES)}
    return sens.Case(keep, profile)


def _pct(x: float) -> str:
    """One decimal with its sign; a gain that rounds to nothing is +0.0, never -0.0."""
    return "" if math.isnan(x) else f"{round(x, 1) or 0.0:+.1f}"


def _target(scheme: str, metric: str, gain: float) -> str:
    return f"{scheme} {gain:+.1f} % {TARGET_LABEL[metric]}"


def rows_frame(rows: list[sens.Row]) -> pd.DataFrame:
    out = []
    for r in rows:
        row = {"assumption": r.assumption, "value": r.value, "mark": r.mark}
        row.update({f"{s}_gain_pct": r.gains.get((s, "tflops"), math.nan) for s in sens.SCHEMES})
        row.update({f"needed_{s}_{m}": r.needed.get((s, m), "") for s, m, _ in TARGETS})
        row["notes"] = "; ".join(r.notes)
        out.append(row)
    return pd.DataFrame(out)


def report(base: sens.Case, rows: list[sens.Row]) -> str:
    """The tables and the summary, as markdown that reads as plain text too."""
    marks: list[str] = []

    def ref(mark: str) -> str:
        if mark not in marks:
            marks.append(mark)
        return f"{mark.partition(':')[0]} [{marks.index(mark) + 1}]"

    published = ", ".join(_target(s, m, g) for s, m, g in TARGETS)
    lines = [f"Sensitivity at {PUBLISHED_GPUS} GPUs: predicted gain % over the baseline "
             "(TFLOPS/GPU and samples/s alike: one iteration time), one assumption changed at a "
             f"time, the others as in the base case (published: {published})", "",
             "| assumption | value | naive | zhybrid | mzhybrid | mark |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        gains = " | ".join(_pct(r.gains.get((s, "tflops"), math.nan)) for s in sens.SCHEMES)
        lines.append(f"| {r.assumption} | {r.value} | {gains} | {ref(r.mark)} |")
    lines += ["", "What the assumption alone would have to be for each published gain "
              "(bisection where the gain is monotone in it; a scan of an integer; the listed "
              "values of a discrete one):", "",
              "| assumption | " + " | ".join(_target(*t) for t in TARGETS) + " |",
              "|---|" + "---|" * len(TARGETS)]
    for r in rows:
        if r.needed:
            lines.append(f"| {r.assumption} | "
                         + " | ".join(r.needed[(s, m)] for s, m, _ in TARGETS) + " |")
    notes = sorted({n for r in rows for n in r.notes})
    lines += [""] + [f"Note: {n}." for n in notes]
    lines += ["", "Inputs of the base case, each published, measured or assumed:"]
    for key, mark in base.profile.provenance.items():
        lines.append(f"- profile {key} = {_shown(profile_value(base.profile, key))}: {mark}")
    lines += [f"- {what}: {mark}" for what, mark in CONFIG_INPUTS]
    lines += ["", "Sources of the marks in the table:"]
    lines += [f"[{i}] {mark}" for i, mark in enumerate(marks, 1)]
    lines += [""] + summary(base)
    return "\n".join(lines)


def _shown(value: object) -> str:
    if hasattr(value, "encode_gbs"):
        return f"{value.encode_gbs:g}/{value.decode_gbs:g} GB/s"  # type: ignore[attr-defined]
    if hasattr(value, "dtypes"):
        return f"{value.dtypes} on {value.ops}"  # type: ignore[attr-defined]
    return f"{value:g}" if isinstance(value, float) else str(value)


def summary(base: sens.Case) -> list[str]:
    """The best-supported prediction, stated plainly, and the share of each published gain."""
    case, assumed = sens.best_supported(base, what_ifs.assumptions(base.profile))
    gains = sens.gains(case)
    shown = ", ".join(f"{s} {_pct(gains[(s, 'tflops')])} %" for s in sens.SCHEMES
                      if (s, "tflops") in gains)
    shares = "; ".join(
        f"{_target(s, m, g)}: {_pct(gains[(s, m)])} % predicted = "
        f"{gains[(s, m)] / g * 100:.0f} % of it" for s, m, g in TARGETS)
    return [
        f"Best-supported prediction at {PUBLISHED_GPUS} GPUs (every input at its published "
        "or measured value where one exists; still assumed: " + "; ".join(assumed) + "): "
        f"{shown} (TFLOPS/GPU and samples/s).",
        "Share of the published gains reached with published and measured values only: "
        + shares + ".",
        "No input is fitted to the published gains: the values above are solved for this "
        "table only and no prediction uses them.",
    ]


def table(base: sens.Case) -> list[sens.Row]:
    """Every what-if of what_ifs.py, solved."""
    return sens.table(base, what_ifs.assumptions(base.profile))


def write(base: sens.Case, rows: list[sens.Row], tables: Path, exp: str) -> str:
    """The report (returned, for printing) and the rows, under tables/."""
    text = report(base, rows)
    tables.mkdir(parents=True, exist_ok=True)
    rundir.write_atomic(tables / f"{exp}.sensitivity.md", text + "\n")
    write_table(rows_frame(rows), tables / f"{exp}.sensitivity.csv")
    return text
