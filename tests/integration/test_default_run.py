"""The default experiment (local_compare) ends with tables, figures and the summary table."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from tests.conftest import REPO_ROOT

SCHEMES = {"none", "naive", "zhybrid", "mzhybrid"}


def test_default_run_leaves_figures_and_summary_of_four_schemes(tmp_path):
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "neoxlab", "train.steps=4", "logger.wandb=disabled",
         f"launch.results_dir={results}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for member in ("local_baseline", "local_naive", "local_zhybrid", "local_mzhybrid"):
        assert len(list((results / member).iterdir())) == 1
    runs = pd.read_parquet(results / "tables" / "local_compare.runs.parquet")
    assert set(runs["scheme"]) == SCHEMES
    assert set(runs["status"]) == {"completed"}
    summary = (results / "tables" / "local_compare.summary.md").read_text().lower()
    for name in ("baseline", "naive", "| zhybrid", "mzhybrid"):
        assert name in summary, summary
    for kind in ("throughput", "loss", "comm"):
        for ext in ("png", "pdf"):
            path = results / "figures" / f"local_compare.{kind}.{ext}"
            assert path.stat().st_size > 1000, path
    assert "figures:" in proc.stdout
