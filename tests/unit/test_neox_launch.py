"""Per-rank command, environment and train.py arguments; GPU choice; metrics from logs."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import yaml

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.entry import gpu_local_rank, train_argv
from neoxlab.engines.neox.launch import LOCK_FILE, SHIM_DIR, rank_command, rank_env, read_lock
from neoxlab.engines.neox.metrics import collect_metrics
from tests.conftest import REPO_ROOT

LOGS = REPO_ROOT / "tests" / "fixtures" / "logs"
NEOX = ["engine=neox", "cluster.neox_dir=/gpfs/me/gpt-neox",
        "data.path=/gpfs/me/data/pile_text_document", "data.vocab_file=/gpfs/me/tok.json"]


@pytest.fixture
def neox_run(results_dir) -> Path:
    cfg = compose_experiment("baseline_192gpu", [*NEOX, f"launch.results_dir={results_dir}"])
    return plan_run(cfg, check(cfg), [], results_dir)


def test_rank_command_and_environment(neox_run):
    cfg = compose_experiment("baseline_192gpu", NEOX)
    assert rank_command(cfg, neox_run, "/usr/bin/python3") == [
        "/usr/bin/python3", "-m", "neoxlab.engines.neox.entry", str(neox_run.resolve())]
    env = rank_env(cfg, neox_run)
    assert env["PYTHONPATH"].split(":") == [
        str(SHIM_DIR), str(REPO_ROOT / "src"), "/gpfs/me/gpt-neox"]
    assert (SHIM_DIR / "sitecustomize.py").is_file()
    assert env["NEOXLAB_RUN_DIR"] == str(neox_run.resolve())
    with pytest.raises(ConfigError, match="cluster.neox_dir=/path/to/gpt-neox"):
        rank_env(compose_experiment("baseline_192gpu", ["engine=neox"]), neox_run)


def test_train_argv_carries_neox_yml_as_deepy_would(neox_run):
    """consume_neox_args decodes --megatron_config as urlsafe base64 of a JSON dict."""
    neox_dir = Path("/gpfs/me/gpt-neox")
    argv = train_argv(neox_run, neox_dir)
    assert argv[:2] == ["/gpfs/me/gpt-neox/train.py", "--megatron_config"] and len(argv) == 3
    sent = json.loads(base64.urlsafe_b64decode(argv[2]).decode("utf-8"))
    text = (neox_run / "neox.yml").read_text()
    expected = yaml.load(text, Loader=yaml.FullLoader)
    assert {k: v for k, v in sent.items() if k not in ("config_files", "user_script")} == expected
    assert sent["config_files"] == {"neox.yml": text}
    assert sent["user_script"] == "/gpfs/me/gpt-neox/train.py"
    assert sent["global_num_gpus"] == 192  # else GPT-NeoX counts only one node's GPUs


@pytest.mark.parametrize(("rank", "node_local", "devices", "expected"), [
    (5, 1, 1, 0),  # jsrun -g1: each rank sees one GPU, GPT-NeoX asserts LOCAL_RANK == 0
    (6, 2, 4, 2),  # a node's 4 GPUs visible, ranks in blocks of 4 per node
    (3, 3, 0, 3),  # no GPU visible: the node-local rank stays
    (7, 1, 2, 1),  # jsrun -a2 -g2: two ranks share a resource set of two GPUs
])
def test_gpu_local_rank(rank, node_local, devices, expected):
    assert gpu_local_rank(rank, node_local, devices) == expected


def test_gpu_local_rank_refuses_ranks_that_would_share_a_gpu():
    with pytest.raises(RuntimeError, match="distribution=block"):
        gpu_local_rank(rank=1, node_local_rank=0, device_count=4)  # cyclic placement


def test_upstream_lock_names_the_versions():
    lock = read_lock(LOCK_FILE)
    assert len(lock["gpt_neox_commit"]) == 40
    assert lock["deepspeed"] == "0.19.8" and lock["megatron_core"] == "0.16.1"


def test_read_lock_refuses_a_line_without_equals(tmp_path):
    bad = tmp_path / "upstream.lock"
    bad.write_text("# comment\ngpt_neox_commit abc\n")
    with pytest.raises(ValueError, match="key = value"):
        read_lock(bad)


def test_collect_metrics_from_gpt_neox_rank_logs(neox_run):
    shutil.copy(LOGS / "neox_rank0.log", neox_run / "logs" / "rank0.log")
    (neox_run / "logs" / "rank1.log").write_text("nothing to see\n")
    (neox_run / "summary.json").write_text(json.dumps({"comm": {"dp": {"calls": 3}}}))
    path = collect_metrics(neox_run)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    # The fixture has good lines at iterations 10, 20, 30, 50 and a broken one at 40.
    steps = [r["step"] for r in records]
    assert steps[:4] == [10, 20, 30, 50] and 40 not in steps
    first = records[0]
    assert first["iteration_s"] == pytest.approx(146.8912)
    batch = 4 * 32 * (192 // (2 * 8))
    assert first["samples_per_s"] == pytest.approx(batch / 146.8912)
    assert first["tokens_per_s"] == pytest.approx(batch * 2048 / 146.8912)
    h, s, layers, vocab = 6144, 2048, 44, 50432  # 50277 padded to a multiple of 64 x tp=4
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    assert first["tflops_per_gpu"] == pytest.approx(flops / 146.8912 / 192 / 1e12)
    assert first["neox_tflops_per_gpu"] == pytest.approx(41.3)
    assert first["loss"] == pytest.approx(10.6153) and first["loss_scale"] == 65536.0
    assert first["lr"] == pytest.approx(9.7e-5)
    summary = json.loads((neox_run / "summary.json").read_text())
    assert summary["comm"] == {"dp": {"calls": 3}}  # kept
    assert summary["steps_source"] == "neox_log" and summary["malformed_lines"] >= 1
    assert summary["steps"] == len(records)


def test_collect_metrics_keeps_the_last_line_of_a_repeated_step(neox_run):
    line = (" samples/sec: 1.0 | iteration {it:8d}/     100 | elapsed time per iteration (ms): "
            "{ms} | learning rate: 1.0E-04 | approx flops per GPU: 1.0TFLOPS | lm_loss: "
            "{loss} | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    text = (line.format(it=1, ms="1000.0", loss="5.0E+00")
            + line.format(it=2, ms="1000.0", loss="4.0E+00")
            + "resumed from checkpoint at iteration 1\n"
            + line.format(it=2, ms="2000.0", loss="3.0E+00"))
    (neox_run / "logs" / "rank0.log").write_text(text)
    records = [json.loads(x) for x in collect_metrics(neox_run).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["loss"] == 3.0 and records[1]["iteration_s"] == 2.0


def test_rank_zero_builds_gpt_neox_data_helpers_once(tmp_path):
    from neoxlab.engines.neox.entry import build_data_helpers

    run_dir = tmp_path / "run"
    build_data_helpers(tmp_path, run_dir)  # no megatron/data/Makefile: nothing to do
    data = tmp_path / "megatron" / "data"
    data.mkdir(parents=True)
    (data / "Makefile").write_text("helpers.so:\n\techo built >> log.txt\n\ttouch helpers.so\n")
    build_data_helpers(tmp_path, run_dir)
    build_data_helpers(tmp_path, run_dir)  # up to date: make does nothing the second time
    assert (data / "log.txt").read_text() == "built\n"
    (data / "Makefile").write_text("helpers.so:\n\tfalse\n")
    (data / "helpers.so").unlink()
    with pytest.raises(RuntimeError, match="dataset helpers"):
        build_data_helpers(tmp_path, run_dir)
