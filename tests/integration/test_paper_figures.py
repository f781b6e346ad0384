"""`make figures EXP=paper_grid`: the paper's figures from GPT-NeoX logs of the 16-job grid
(tests/fixtures/paper_grid, written by tests/fixtures/make_paper_grid.py with hand-chosen
throughput) when they are there, else from the performance model's predictions; the
published 192-GPU gains drawn beside them either way."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.files import REPO_ROOT
from neoxlab.perfmodel.predict import predict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXP = "paper_grid"
GPUS = [32, 64, 128, 192]
SCHEMES = {"none", "naive", "zhybrid", "mzhybrid"}
# the fixture's hand-chosen numbers (make_paper_grid.py): baseline TFLOPS/GPU at 192 GPUs and
# each scheme's speed-up over it
BASE_192, SPEEDUP = 30.0, {"naive": 1.10, "zhybrid": 1.06, "mzhybrid": 1.03}
PUBLISHED = {("naive", "tflops_gain_pct"): 22.5, ("naive", "samples_gain_pct"): 23.6,
             ("zhybrid", "tflops_gain_pct"): 17.3, ("zhybrid", "samples_gain_pct"): 12.7}


def _figures(results: Path) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "neoxlab.results.figures", "--exp", EXP, "--results",
           str(results)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def from_logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    results = tmp_path_factory.mktemp("logs") / "results"
    shutil.copytree(FIXTURES / "paper_grid", results)
    return results, *_figures(results)


@pytest.fixture(scope="module")
def from_predictions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    results = tmp_path_factory.mktemp("pred") / "results"
    return results, *_figures(results)


def _points(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "tables" / f"{EXP}.paper_points.csv")


def _check_drawn(results: Path) -> None:
    for ext in ("png", "pdf"):
        path = results / "figures" / f"{EXP}.paper.{ext}"
        assert path.is_file() and path.stat().st_size > 10_000, path


def _check_published(points: pd.DataFrame) -> None:
    pub = points[points["source"] == "published"].set_index("scheme")
    assert set(pub["gpus"]) == {192}
    for (scheme, col), gain in PUBLISHED.items():
        assert pub.loc[scheme, col] == pytest.approx(gain)


@pytest.mark.timeout(600)
def test_the_grid_is_drawn_from_gpt_neox_logs(from_logs):
    results, rc, output = from_logs
    assert rc == 0, output
    _check_drawn(results)
    points = _points(results)
    drawn = points[points["source"] != "published"]
    assert set(drawn["source"]) == {"neox_log"}
    assert {(r.scheme, r.gpus) for r in drawn.itertuples()} == {
        (s, n) for s in SCHEMES for n in GPUS}
    at192 = drawn[drawn["gpus"] == 192].set_index("scheme")
    assert at192.loc["none", "tflops_per_gpu"] == pytest.approx(BASE_192)
    for scheme, speedup in SPEEDUP.items():
        assert at192.loc[scheme, "tflops_per_gpu"] == pytest.approx(BASE_192 * speedup)
        assert at192.loc[scheme, "tflops_gain_pct"] == pytest.approx((speedup - 1) * 100)
        assert at192.loc[scheme, "samples_gain_pct"] == pytest.approx((speedup - 1) * 100,
                                                                      abs=0.05)
    _check_published(points)
    loss = pd.read_parquet(results / "tables" / f"{EXP}.steps.parquet")
    assert set(loss["gpus"]) == set(GPUS) and loss["loss"].notna().all()


@pytest.mark.timeout(600)
def test_without_runs_the_grid_is_drawn_from_predictions(from_predictions):
    results, rc, output = from_predictions
    assert rc == 0, output
    assert f"{EXP}: no runs yet: only the notebooks that draw without them" in output
    _check_drawn(results)
    points = _points(results)
    drawn = points[points["source"] != "published"]
    assert set(drawn["source"]) == {"predicted"}
    assert {(r.scheme, r.gpus) for r in drawn.itertuples()} == {
        (s, n) for s in SCHEMES for n in GPUS}
    naive = drawn[(drawn["scheme"] == "naive") & (drawn["gpus"] == 192)].iloc[0]
    expected = predict(compose_experiment("naive_192gpu", ["task=predict"]))
    assert naive["tflops_per_gpu"] == pytest.approx(expected.tflops_per_gpu)
    assert naive["samples_per_s"] == pytest.approx(expected.samples_per_s)
    _check_published(points)
    # only the notebook that draws without runs ran: no throughput figure of runs
    assert not (results / "figures" / f"{EXP}.throughput.png").exists()
