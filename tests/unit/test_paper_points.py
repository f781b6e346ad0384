"""The paper figure's published gains sit only beside a grid they can be compared with, and
the CPU grid's committed data is the figure's."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from neoxlab.files import REPO_ROOT
from neoxlab.results import paper, rundata


def _points(model: str, device: str) -> pd.DataFrame:
    return pd.DataFrame([{"scheme": s, "gpus": 8, "model": model, "device": device}
                         for s in ("none", "naive")])


def test_published_gains_belong_beside_the_papers_model_on_gpus():
    assert paper.published_note(_points("neox_20b", "v100")) is None
    assert paper.published_note(_points("None", "")) is None  # a log given alone: unknown


def test_a_cpu_grid_says_why_the_published_gains_are_left_out():
    note = paper.published_note(_points("neox_tiny", "cpu"))
    assert note is not None and "not drawn" in note
    assert "neox_tiny on CPU ranks" in note and "V100" in note
    assert paper.published_note(_points("neox_20b", "cpu")) is not None
    assert paper.published_note(_points("neox_tiny", "v100")) is not None


def test_the_committed_grid_rows_give_the_figures_points():
    """studies/paper_grid_neox_cpu.py --from-data recomputes, from each run's steps alone,
    the samples/s and gains the figure drew from the collected tables (paper_points.csv,
    committed beside the rows): the dated page's table is the figure's."""
    data = REPO_ROOT / "docs" / "measurements" / "data" / "2026-12-07-paper-grid-neox-cpu"
    spec = importlib.util.spec_from_file_location(
        "paper_grid_neox_cpu", REPO_ROOT / "studies" / "paper_grid_neox_cpu.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rows = study.table(rundata.read(data / "runs.jsonl"))
    points = pd.read_csv(data / "paper_points.csv").set_index(["scheme", "gpus"])
    assert len(rows) == len(points) == 8 and set(points["source"]) == {"neox_log"}
    for row in rows:
        point = points.loc[(row["scheme"], row["ranks"])]
        assert row["source"] == point["source"]
        assert row["samples_per_s"] == pytest.approx(point["samples_per_s"])
        assert row["gain_pct"] == pytest.approx(point["samples_gain_pct"], abs=1e-6)
