"""task=tune for real on a tiny local layout (tune_local: neox_tiny, TP=2 x DP=2): codecs
timed here, a baseline run that captures every dimension's messages and leaves the shared
checkpoint, a noise seed, one probe from the checkpoint, the chosen config and the report.
The links are made slow in the profile only (the runs are unchanged), so the model finds
compression worth probing whatever this machine's load does to the codec timings."""

from __future__ import annotations

import json
import subprocess
import sys

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
ARGS = ["experiment=tune_local", "tune.codecs=[none,'zfp:rate=4',int8,fp16]",
        "tune.finalists=1", f"tune.warmup_steps={WARMUP}", f"tune.probe_steps={PROBE}",
        "cluster.profile.intra.bandwidth_gbs=0.0005", "cluster.profile.inter.bandwidth_gbs=0.0005"]

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    configs = tmp_path_factory.mktemp("configs")
    cmd = [sys.executable, "-m", "neoxlab", *ARGS, f"launch.results_dir={results}",
           f"tune.config_dir={configs}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    (run_dir,) = (results / "tune" / "tune_local").iterdir()
    return results, configs, run_dir, proc.stdout


def test_the_baseline_run_captured_every_dimension(tuned):
    _, _, run_dir, _ = tuned
    (baseline,) = (run_dir / "runs" / "baseline" / "tune_local").iterdir()
    captured = load(baseline)
    assert {"tp", "dp", "zero"} <= set(captured)
    assert all(t.dtype == torch.float32 and t.numel() > 0 for ts in captured.values()
               for t in ts)
    assert (baseline / "checkpoints" / f"step{WARMUP}" / "complete.json").exists()


def test_the_proxy_rejects_zfp_rate_4_on_tp_on_measured_messages(tuned):
    """The loss-vs-rate map found ZFP rate 4 harmful on TP alone (DP and ZeRO kept their loss
    in the seed spread), so TP's budget rejects it on this experiment's own messages."""
    results, _, _, _ = tuned
    import pandas as pd

    table = pd.read_parquet(results / "tables" / "tune_local.tune.parquet")
    rate4 = table[(table["kind"] == "candidate") & (table["codec"] == "zfp:rate=4")]
    assert set(rate4["dim"]) == {"tp", "dp", "zero"}
    tp = rate4[rate4["dim"] == "tp"]
    assert (tp["proxy_error"] > tp["budget"]).all()
    assert not tp["proxy_ok"].any() and not tp["chosen"].any()


def test_the_finalist_was_probed_from_the_shared_checkpoint(tuned):
    results, _, run_dir, _ = tuned
    import pandas as pd

    table = pd.read_parquet(results / "tables" / "tune_local.tune.parquet")
    probed = table[(table["kind"] == "scheme") & table["probe_deviation"].notna()]
    assert len(probed) == 1
    (probe,) = (run_dir / "runs" / "probe1" / "tune_local").iterdir()
    status = json.loads((probe / "status.json").read_text())
    assert status["state"] == "completed" and status["attempts"][-1]["resumed_from"] == WARMUP
    steps = [json.loads(line)["step"] for line in
             (probe / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(WARMUP + 1, WARMUP + PROBE + 1))
    verdict = probed.iloc[0]["guard"]
    assert "seed noise" in verdict or "silent failure" in verdict, verdict
    noise = list((run_dir / "runs").glob("noise_seed*/tune_local/*"))
    assert len(noise) == 1


def test_the_chosen_scheme_is_written_as_a_config_that_runs(tuned):
    results, configs, run_dir, stdout = tuned
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
