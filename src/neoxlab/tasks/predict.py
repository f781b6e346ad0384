"""task=predict: compose -> validate -> predict; print a table; nothing is launched.

A single experiment gets a run dir under <results>/predictions/<experiment>/ (frozen config,
layout, provenance, prediction.json). A comparison (`runs: [...]`) predicts every member
(each composed with task=predict), writes <results>/tables/<exp>.predicted.{parquet,csv,md}
and draws analysis/predicted.py's figure; at 192 GPUs on the paper's grid it prints the
predicted gains beside the published ones and the sensitivity table
(<exp>.sensitivity.{md,csv}: perfmodel.sensitivity).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from neoxlab.config import Config
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import prediction_tables as report
from neoxlab.perfmodel.predict import Prediction, predict
from neoxlab.results import figures
from neoxlab.results import sensitivity as sensitivity_report
from neoxlab.results.tables import write_table
from neoxlab.run import rundir
from neoxlab.tune import insitu

PREDICTIONS_DIR = "predictions"  # under launch.results_dir: the task record's output_dir


def run_predict(cfg: Config, configs: list[Config], argv: list[str]) -> int:
    """The members (checked by the caller, commands/check.py) each given a profile before
    anything is written; then predicted, tabled and drawn."""
    resolved = [insitu.resolve(member) for member in configs]
    preds = [predict(m, r.profile, r.origin) for m, r in zip(configs, resolved, strict=True)]
    results = Path(cfg.launch.results_dir)
    for member, pred in zip(configs, preds, strict=True):
        run_dir = write_prediction(member, pred, argv, results)
        print(f"[neoxlab] prediction: {run_dir / 'prediction.json'}", flush=True)
    frame = report.table(preds)
    print(f"[neoxlab] profile: {resolved[0].origin}", flush=True)
    print(report.format_table(frame), flush=True)
    for note in sorted({n for p in preds for n in p.notes}):
        print(f"[neoxlab] note: {note}", flush=True)
    if not cfg.runs:
        return 0
    write_tables(frame, results / "tables", cfg.experiment)
    text = report.published_comparison(frame)
    if text:
        print(text, flush=True)
        rundir.write_atomic(results / "tables" / f"{cfg.experiment}.published.txt", text + "\n")
    by_name = {m.experiment: m for m in configs}
    base = sensitivity_report.base_case(frame, by_name, resolved[0].profile)
    if base is not None:
        rows = sensitivity_report.table(base)
        print(sensitivity_report.write(base, rows, results / "tables", cfg.experiment),
              flush=True)
        print(f"[neoxlab] table: {results}/tables/{cfg.experiment}.sensitivity.{{md,csv}}",
              flush=True)
    return figures.draw_one("predicted.py", cfg.experiment, results)


def write_prediction(cfg: Config, pred: Prediction, argv: list[str], results: Path) -> Path:
    run_dir = rundir.freeze(cfg, resolve_layout(cfg), argv, root=results / PREDICTIONS_DIR)
    rundir.write_json(run_dir / "prediction.json", dataclasses.asdict(pred))
    rundir.set_status(run_dir, rundir.State.PREDICTED)
    return run_dir


def write_tables(frame: pd.DataFrame, tables: Path, exp: str) -> None:
    tables.mkdir(parents=True, exist_ok=True)
    for suffix in (".parquet", ".csv"):
        write_table(frame, tables / f"{exp}.predicted{suffix}")
    rundir.write_atomic(tables / f"{exp}.predicted.md", report.format_table(frame) + "\n")
    print(f"[neoxlab] table: {tables}/{exp}.predicted.{{parquet,csv,md}}", flush=True)
