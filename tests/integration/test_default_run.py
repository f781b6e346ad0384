"""The default experiment (local_compare) ends with tables, figures and the summary table.
The run is the session's `compare_run` (conftest), which the compression tests share."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.integration.harness import COMPARE_MEMBERS

SCHEMES = {"none", "naive", "zhybrid", "mzhybrid"}


@pytest.mark.timeout(1000)  # its set-up may make the session's local_compare run (<= 900 s)
def test_default_run_leaves_figures_and_summary_of_four_schemes(compare_run):
    results = compare_run.results
    for member in COMPARE_MEMBERS:
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
    assert "figures:" in compare_run.proc.stdout
