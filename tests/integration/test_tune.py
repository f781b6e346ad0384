"""task=tune for real on a tiny local layout (tune_local: neox_tiny, TP=2 x DP=2): codecs
timed here, a baseline run that captures every dimension's messages and leaves the shared
checkpoint, a noise run from it, two probes from it, the chosen config and the report.
The links are made slow in the profile only (the runs are unchanged), so compression must pay
whatever this machine's load does to the codec timings: a tuner that keeps `none` fails here.

The candidates include harsh codecs: ZFP rate 2 (harmful on every dimension of the
loss-vs-rate map) and top-k at 1 %, the cheapest predicted on both dimensions. Stage (a)
rejects rate 2 everywhere and top-k on TP; DP's budget is raised (tune.error_budget.dp=0.8)
so that top-k passes stage (a) there and stage (b) must catch it: the fastest finalist
(TP int8, DP top-k) is probed and rejected, the next (TP int8, DP int8) passes. So a tuner
that ignores the guard, or whose guard rejects everything, fails here too."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from neoxlab.comm.capture import load
from neoxlab.comm.compression_rules import validate_compression
from neoxlab.config import CompressionConfig
from neoxlab.config.compose import compose_experiment
from tests.conftest import REPO_ROOT

WARMUP, PROBE = 3, 4
HARSH = ("zfp:rate=2", "topk:ratio=0.01")
ARGS = ["experiment=tune_local", "tune.dims=[tp,dp]",
        "tune.codecs=[none,'zfp:rate=2',int8,'topk:ratio=0.01']", "tune.allreduce=[auto]",
        "tune.reduce_to_owner=[false]", "tune.error_feedback=[false]", "tune.error_budget.dp=0.8",
        "tune.finalists=2", "tune.probe_share=1.0", f"tune.warmup_steps={WARMUP}",
        f"tune.probe_steps={PROBE}",
        "cluster.profile.intra.bandwidth_gbs=0.0005", "cluster.profile.inter.bandwidth_gbs=0.0005"]

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    configs = tmp_path_factory.mktemp("configs")
    cmd = [sys.executable, "-m", "neoxlab", *ARGS, f"launch.results_dir={results}",
           f"tune.config_dir={configs}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    (run_dir,) = (results / "tune" / "tune_local").iterdir()
    table = pd.read_parquet(results / "tables" / "tune_local.tune.parquet")
    return results, configs, run_dir, proc.stdout, table


def candidates(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["kind"] == "candidate"]


def schemes(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["kind"] == "scheme"]


def test_the_baseline_run_captured_every_dimension(tuned):
    _, _, run_dir, _, _ = tuned
    (baseline,) = (run_dir / "runs" / "baseline" / "tune_local").iterdir()
    captured = load(baseline)
    assert {"tp", "dp", "zero"} <= set(captured)
    assert all(t.dtype == torch.float32 and t.numel() > 0 for ts in captured.values()
               for t in ts)
    assert (baseline / "checkpoints" / f"step{WARMUP}" / "complete.json").exists()


def test_on_links_this_slow_the_pick_compresses_every_tuned_dimension(tuned):
    """A tuner that returns none, or whose guard rejects everything, keeps the baseline."""
    _, configs, run_dir, _, table = tuned
    (path,) = configs.glob("tuned_tune_local.yaml")
    data = yaml.safe_load(path.read_text())
    dims = data.get("compression", data)["dims"]
    compressed = {d for d, v in dims.items() if v.get("compressor", "none") != "none"}
    assert compressed == {"tp", "dp"}, dims
    assert json.loads((run_dir / "tune.json").read_text())["chosen"] != "none"
    (chosen,) = schemes(table)[schemes(table)["chosen"]].itertuples()
    assert chosen.label != "none" and "within the noise" in chosen.guard, chosen.guard
    assert chosen.probe_deviation <= chosen.probe_threshold


def test_stage_a_rejects_zfp_rate_2_everywhere_and_top_k_on_tp(tuned):
    """The loss-vs-rate map found ZFP rate 2 harmful on every dimension; the budgets come
    from its data file (TP's 0.0203), DP's raised by the test's override to 0.8."""
    _, _, _, _, table = tuned
    c = candidates(table)
    assert c[c["dim"] == "tp"]["budget"].eq(0.0203).all()
    assert c[c["dim"] == "dp"]["budget"].eq(0.8).all()
    rejected = c[~c["proxy_ok"].astype(bool)]
    assert set(zip(rejected["dim"], rejected["codec"], strict=True)) == {
        ("tp", "zfp:rate=2"), ("dp", "zfp:rate=2"), ("tp", "topk:ratio=0.01")}
    assert (rejected["proxy_error"] > rejected["budget"]).all()
    assert not rejected["chosen"].any()


def test_the_cheapest_predicted_codec_is_not_what_a_guarded_tuner_picks(tuned):
    """A tuner that takes the cheapest predicted codec per dimension and ignores the guard
    picks a harsh one: on both dimensions it is one of the harsh codecs."""
    _, _, _, _, table = tuned
    c = candidates(table)
    for dim in ("tp", "dp"):
        mine = c[c["dim"] == dim]
        cheapest = mine.loc[mine["predicted_step_s"].idxmin()]
        assert cheapest["codec"] in HARSH, (dim, cheapest["codec"])
        assert not cheapest["chosen"]
    chosen = c[c["chosen"].astype(bool)]
    assert set(chosen["dim"]) == {"tp", "dp"} and chosen["proxy_ok"].astype(bool).all()
    assert not set(chosen["codec"]) & set(HARSH)


def test_stage_b_rejects_the_fastest_finalist_that_passed_stage_a(tuned):
    """top-k on DP passed stage (a) (budget 0.8); its probe deviates from the same-seed
    baseline by more than the noise from the checkpoint allows, so the slower finalist with
    int8 on DP is chosen."""
    _, _, run_dir, stdout, table = tuned
    probed = schemes(table)[schemes(table)["probe_deviation"].notna()].sort_values(
        "predicted_step_s")
    assert len(probed) == 2
    first, second = probed.iloc[0], probed.iloc[1]
    assert "dp=topk:ratio=0.01" in first["label"] and not first["chosen"]
    assert "> threshold" in first["guard"] and first["probe_deviation"] > first["probe_threshold"]
    assert second["chosen"] and "dp=int8" in second["label"]
    assert "stage (b): probe 1 done" in stdout and "REJECTED" in stdout
    recorded = json.loads((run_dir / "tune.json").read_text())["probes"]
    assert [(p["run"], p["label"], p["ok"]) for p in recorded] == [
        ("probe1", first["label"], False), ("probe2", second["label"], True)]
    for name in ("probe1", "probe2"):
        (probe,) = (run_dir / "runs" / name / "tune_local").iterdir()
        status = json.loads((probe / "status.json").read_text())
        assert status["state"] == "completed" and status["attempts"][-1]["resumed_from"] == WARMUP
        steps = [json.loads(line)["step"] for line in
                 (probe / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(WARMUP + 1, WARMUP + PROBE + 1))


def test_the_noise_run_starts_from_the_shared_checkpoint_on_another_data_order(tuned):
    _, _, run_dir, _, _ = tuned
    (noise,) = (run_dir / "runs").glob("noise_data*/tune_local/*")
    (baseline,) = (run_dir / "runs" / "baseline" / "tune_local").iterdir()
    status = json.loads((noise / "status.json").read_text())
    assert status["attempts"][-1]["resumed_from"] == WARMUP
    seeds = [json.loads((d / "config.json").read_text())["data"]["seed"] for d in (noise, baseline)]
    assert seeds[0] != seeds[1]
    assert json.loads((noise / "config.json").read_text())["train"]["seed"] == json.loads(
        (baseline / "config.json").read_text())["train"]["seed"]


def test_the_chosen_scheme_is_written_as_a_config_that_runs(tuned):
    results, configs, run_dir, stdout, _ = tuned
    (path,) = configs.glob("tuned_tune_local.yaml")
    data = yaml.safe_load(path.read_text())
    body = data.get("compression", data)
    assert body["scheme"] == "tuned_tune_local"
    tune = json.loads((run_dir / "tune.json").read_text())
    assert tune["cost_s"]["total"] > 0 and tune["config"] == str(path)
    print(f"tuner wall time {tune['cost_s']['total']:.1f} s: {tune['cost_s']}")
    cfg = compose_experiment("tune_local")
    cfg.compression = OmegaConf.to_object(OmegaConf.merge(
        OmegaConf.structured(CompressionConfig), body))
    assert validate_compression(cfg, trains=True) == []
    assert (results / "figures" / "tune_local.tune.png").exists()
    assert "chosen scheme:" in stdout
