"""Per-run rows for committed data files (results/rundata.py): a row keeps what a study's
tables need once the run dir is gone."""

from __future__ import annotations

import json

import pytest

from neoxlab.results import rundata
from tests.conftest import REPO_ROOT

RUN = REPO_ROOT / "tests/fixtures/runs/local_compare/20261201-120001_tp2-pp2-dp2_z1_naive"


def test_a_row_keeps_every_step_the_config_and_the_bytes_per_dimension():
    row = rundata.run_row(RUN, scheme="naive", repeat=1)
    metrics = [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]
    assert row["scheme"] == "naive" and row["run_id"] == RUN.name
    assert row["loss"] == [m["loss"] for m in metrics]
    assert row["step_s"] == [m["iteration_s"] for m in metrics]
    summary = json.loads((RUN / "summary.json").read_text())
    assert row["bytes"]["dp"]["bytes_out"] == summary["comm"]["dp"]["bytes_out"]
    assert row["config"]["dims"]["dp"]["compressor"] == "zfp"


def test_rows_append_and_a_run_written_again_replaces_its_row(tmp_path):
    path = tmp_path / "data" / "study.runs.jsonl"
    rundata.append(path, [rundata.run_row(RUN, repeat=1)])
    rundata.append(path, [rundata.run_row(RUN, repeat=2)])
    (row,) = rundata.read(path)
    assert row["repeat"] == 2


def test_a_missing_or_broken_data_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        rundata.read(tmp_path / "nowhere.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"run_dir": "a"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl.*line 2"):
        rundata.read(bad)
