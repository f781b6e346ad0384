"""The data of the paper's figures for a comparison grid (analysis/paper_grid.py draws them):
throughput and gains per scheme and GPU count, each point with its source, and loss curves.

The points come from the grid's runs when any completed with throughput (GPT-NeoX logs:
source neox_log; neoxlab's own metrics: metrics.jsonl), else from the performance model's
predictions of every member (source predicted, no loss curves: the model predicts none).
The published 192-GPU gains are rows of their own (source published), drawn only beside a
grid of the paper's model on GPUs: beside a CPU-rank grid (paper_grid_neox_cpu) or another
model they would set Lassen's numbers next to unlike ones, so the figure says why they are
left out instead (published_note).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from neoxlab.config.compose import compose_experiment
from neoxlab.perfmodel.predict import gain_pct, predict
from neoxlab.perfmodel.published import PUBLISHED, PUBLISHED_GPUS
from neoxlab.results.tables import BASELINE, comparison_members

POINT_COLUMNS = ("scheme", "gpus", "tflops_per_gpu", "samples_per_s", "tflops_gain_pct",
                 "samples_gain_pct", "source", "model", "device")
LOSS_COLUMNS = ("scheme", "gpus", "run_id", "status", "step", "loss", "loss_smooth", "source")
PREDICTED, PUBLISHED_SOURCE = "predicted", "published"
PAPER_MODEL = "neox_20b"  # the model of the published gains (perfmodel/published.py)
PUBLISHED_SETTING = f"GPT-NeoX-20B, ZeRO-1, {PUBLISHED_GPUS} V100 on Lassen"


def _table(tables: Path, exp: str, name: str) -> pd.DataFrame | None:
    path = tables / f"{exp}.{name}.parquet"
    return pd.read_parquet(path) if path.exists() else None


def measured(exp: str, results: Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Points and loss curves from the grid's collected runs; None when no run completed
    with throughput."""
    tables = results / "tables"
    compare, runs = _table(tables, exp, "compare"), _table(tables, exp, "runs")
    if compare is None or runs is None or compare.empty:
        return None
    done = runs[runs["status"] == "completed"]
    joined = done.groupby(["scheme", "gpus"])[["steps_source", "device"]].agg(
        lambda s: "+".join(sorted({str(v) for v in s})))
    points = compare.copy()
    for col, out in (("steps_source", "source"), ("device", "device")):
        points[out] = [joined[col].get((r.scheme, r.gpus), "") for r in points.itertuples()]
    steps = _table(tables, exp, "steps")
    loss = pd.DataFrame(columns=LOSS_COLUMNS)
    if steps is not None and not steps.empty:
        source = runs.set_index("run_id")["steps_source"]
        loss = steps.assign(source=steps["run_id"].map(source))
    return points[list(POINT_COLUMNS)], loss[list(LOSS_COLUMNS)]


def predicted(exp: str) -> pd.DataFrame:
    """Every member of the grid predicted (composed with task=predict, its cluster's profile)."""
    cfgs = [compose_experiment(member, ["task=predict"]) for member in comparison_members(exp)]
    preds = [predict(cfg) for cfg in cfgs]
    if not preds:
        raise ValueError(f"experiment {exp!r} has no `runs:` members to predict; the paper's "
                         "figures need a comparison grid such as paper_grid")
    base = {p.gpus: p for p in preds if p.scheme == BASELINE}
    rows = []
    for p, cfg in zip(preds, cfgs, strict=True):
        b = base.get(p.gpus)
        rows.append({
            "scheme": p.scheme, "gpus": p.gpus, "tflops_per_gpu": p.tflops_per_gpu,
            "samples_per_s": p.samples_per_s,
            "tflops_gain_pct": gain_pct(p.tflops_per_gpu, b.tflops_per_gpu) if b else math.nan,
            "samples_gain_pct": gain_pct(p.samples_per_s, b.samples_per_s) if b else math.nan,
            "source": PREDICTED, "model": cfg.model.name, "device": cfg.cluster.device,
        })
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def published() -> pd.DataFrame:
    """The published gains at 192 GPUs, one row per scheme (no absolute values: gains only)."""
    return pd.DataFrame([
        {"scheme": scheme, "gpus": PUBLISHED_GPUS, "tflops_per_gpu": math.nan,
         "samples_per_s": math.nan, "tflops_gain_pct": tflops, "samples_gain_pct": samples,
         "source": PUBLISHED_SOURCE, "model": PAPER_MODEL, "device": "v100"}
        for scheme, (tflops, samples) in PUBLISHED.items()], columns=list(POINT_COLUMNS))


def published_note(points: pd.DataFrame) -> str | None:
    """None when the published gains belong beside these points (the paper's model on GPUs),
    else the sentence the figure shows in their place."""
    unknown = {"", "None", "nan"}  # e.g. a GPT-NeoX log given alone, without its config
    models = sorted({str(m) for m in points["model"]} - unknown)
    devices = sorted({d for v in points["device"] for d in str(v).split("+")} - unknown)
    if set(models) <= {PAPER_MODEL} and "cpu" not in devices:
        return None
    ranks = " and ".join("CPU" if d == "cpu" else d for d in devices)
    return (f"published gains ({PUBLISHED_SETTING}) not drawn: this grid ran "
            f"{', '.join(models) or 'another model'}" + (f" on {ranks} ranks" if ranks else ""))


def figure_data(exp: str, results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, loss curves): the runs' when any completed, else the predictions; the
    published gains appended to the points where they apply (published_note)."""
    found = measured(exp, results)
    points, loss = found if found is not None else (predicted(exp),
                                                    pd.DataFrame(columns=list(LOSS_COLUMNS)))
    if published_note(points) is not None:
        return points.reset_index(drop=True), loss
    return pd.concat([points, published()], ignore_index=True), loss
