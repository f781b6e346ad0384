"""Loading runs: both GPT-NeoX line formats, run dirs of every status, and the tables."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest

from neoxlab.engines.neox.logs import parse_neox_log
from neoxlab.results import tables as collect
from neoxlab.results.load import describe_compressor, load_run, smooth

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "logs"


@pytest.fixture
def fixture_results(results_dir: Path) -> Path:
    for exp in (FIXTURES / "runs").iterdir():
        shutil.copytree(exp, results_dir / exp.name)
    return results_dir


def test_neox_lines_parse_to_exact_rows_and_malformed_are_counted():
    parsed = parse_neox_log((LOGS / "neox_rank0.log").read_text(), "neox_rank0.log")
    assert [r["step"] for r in parsed.neox] == [10, 20, 30, 50]
    first, second, third, fifth = parsed.neox
    assert first == {
        "step": 10, "total_steps": 100, "iteration_s": pytest.approx(146.8912),
        "samples_per_s": 10.456, "lr": 9.7e-05, "loss": 10.6153, "loss_scale": 65536.0,
        "skipped_iterations": 0, "nan_iterations": 0, "tflops_per_gpu": 41.3,
        "mfu": None, "hfu": None,
    }
    assert second["mfu"] == pytest.approx(0.312) and second["hfu"] == pytest.approx(0.416)
    assert second["skipped_iterations"] == 1 and second["loss_scale"] == 32768.0
    assert third["tflops_per_gpu"] == pytest.approx(41.6)  # 41600.0GFLOPS
    assert third["loss_scale"] is None  # optional field absent (bf16/fp32 runs)
    assert fifth["tflops_per_gpu"] == pytest.approx(42.1)  # 0.0421PFLOPS
    assert [(m.lineno, m.reason) for m in parsed.malformed] == [
        (9, "missing or unreadable: samples_per_s"),
        (11, "missing or unreadable: loss"),  # cut off mid-line by a crash
    ]
    assert parsed.deepspeed == []


def test_deepspeed_pipeline_lines_parse_to_exact_rows():
    parsed = parse_neox_log((LOGS / "deepspeed_pipe.log").read_text())
    rows = parsed.deepspeed
    assert [(r["step"], r["iteration_s"], r["samples_per_s"]) for r in rows] == [
        (10, 146.891, 10.456), (20, 144.736, 10.612), (30, 146.286, 10.5), (50, 143.551, 10.7),
    ]
    assert rows[0]["loss"] == 10.6153 and math.isnan(rows[2]["loss"])
    assert [m.lineno for m in parsed.malformed] == [5]
    assert parsed.neox == []


def test_neox_run_dir_uses_its_log_and_steady_medians():
    run_dir = next((FIXTURES / "runs" / "neox_lassen").iterdir())
    run = load_run(run_dir)
    row = run.row
    assert row["steps_source"] == "neox_log" and row["engine"] == "neox"
    assert (row["gpus"], row["tp"], row["pp"], row["dp"]) == (192, 2, 4, 24)
    # metrics_warmup_steps=10: iteration 10 is excluded; steady = 20, 30, 50.
    assert row["median_tflops_per_gpu"] == pytest.approx(statistics.median([41.9, 41.6, 42.1]))
    assert row["median_samples_per_s"] == pytest.approx(10.612)
    assert row["final_loss"] == 7.25 and row["malformed_lines"] == 2
    # status.json says completed, but the log stops at iteration 50 of 100
    assert row["status"] == "incomplete"
    assert run.steps[0]["tokens_per_s"] == pytest.approx(10.456 * 2048)


def test_a_neox_run_whose_log_became_metrics_jsonl_still_names_the_log(tmp_path: Path):
    """engine=neox writes metrics.jsonl from GPT-NeoX's rank logs after the job; the
    figures must still say their steps came from GPT-NeoX's log, not from neoxlab's own
    metrics (the paper figure's source column)."""
    # deferred: the post-job step of engine=neox, only this test needs it
    from neoxlab.engines.neox.metrics import collect_metrics

    run_dir = tmp_path / "run"
    shutil.copytree(next((FIXTURES / "paper_grid" / "baseline_32gpu").iterdir()), run_dir)
    from_log = load_run(run_dir)
    collect_metrics(run_dir)
    run = load_run(run_dir)
    assert (run_dir / "metrics.jsonl").exists()
    assert from_log.row["steps_source"] == run.row["steps_source"] == "neox_log"
    assert [s["loss"] for s in run.steps] == [s["loss"] for s in from_log.steps]
    builtin = next((FIXTURES / "runs" / "local_compare").iterdir())
    assert load_run(builtin).row["steps_source"] == "metrics.jsonl"


def test_lone_log_file_loads_without_a_run_dir(tmp_path: Path):
    log = tmp_path / "job.out"
    shutil.copy(LOGS / "deepspeed_pipe.log", log)
    run = load_run(tmp_path, log=log)
    assert run.row["run_id"] == "job" and run.row["steps_source"] == "deepspeed_log"
    assert [s["step"] for s in run.steps] == [10, 20, 30, 50]
    assert run.row["status"] == "unknown" and run.row["malformed_lines"] == 1


def test_smooth_is_a_debiased_ema_that_skips_gaps():
    assert smooth([1.0, 3.0], weight=0.5) == pytest.approx([1.0, 7 / 3])
    assert smooth([None, 2.0, float("nan")], weight=0.5) == [None, 2.0, 2.0]


def test_describe_compressor():
    assert describe_compressor({"compressor": "zfp", "params": {"rate": 8}}) == "zfp(rate=8)"
    assert describe_compressor({"compressor": "mpc"}) == "mpc"
    assert describe_compressor(None) == "none"


def test_collect_keeps_every_run_with_its_status(fixture_results: Path):
    tables = collect.collect("local_compare", fixture_results)
    runs = tables["runs"].set_index(["scheme", "gpus"])
    assert len(runs) == 8
    failed = runs.loc[("naive", 16)]
    assert failed["status"] == "failed" and failed["exit_code"] == 1
    assert failed["failed_rank"] == 3 and "step 3" in failed["error"]
    assert failed["steps_done"] == 3
    running = runs.loc[("zhybrid", 16)]
    assert running["status"] == "running" and running["steps_done"] == 2
    assert running["final_loss"] is not None  # recomputed from its metrics, no summary.json
    assert runs.loc[("zhybrid", 8), "compress_tp"] == "zfp(rate=16)"
    assert runs.loc[("mzhybrid", 8), "compress_pp"] == "mpc(dims=1)"
    steps = tables["steps"]
    assert len(steps) == 6 * 20 + 3 + 2
    for name in ("runs.parquet", "runs.csv", "steps.parquet", "comm.parquet",
                 "compare.parquet"):
        assert (fixture_results / "tables" / f"local_compare.{name}").exists()


def test_comm_totals_from_jsonl_when_summary_has_none(fixture_results: Path):
    run_dir = next(d for d in (fixture_results / "local_compare").iterdir()
                   if d.name.endswith("dp4_z1_mzhybrid"))
    assert "comm" not in json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in (run_dir / "comm.jsonl").read_text().splitlines()]
    expected_in = sum(x["bytes_in"] for x in lines if x["dim"] == "dp")
    expected_out = sum(x["bytes_out"] for x in lines if x["dim"] == "dp")
    row = load_run(run_dir).row
    assert row["dp_bytes_in"] == pytest.approx(expected_in)
    assert row["dp_bytes_out"] == pytest.approx(expected_out)
    assert row["dp_bytes_in"] / row["dp_bytes_out"] == pytest.approx(4.0)


def test_compare_gains_match_the_metrics_files(fixture_results: Path):
    compare = collect.collect("local_compare", fixture_results)["compare"]
    got = compare.set_index(["gpus", "scheme"])
    medians = {}
    for run_dir in (fixture_results / "local_compare").iterdir():
        status = json.loads((run_dir / "status.json").read_text())["state"]
        if status != "completed":
            continue
        cfg = json.loads((run_dir / "config.json").read_text())
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steady = [r["samples_per_s"] for r in rows if r["step"] > 2]
        world = cfg["cluster"]["nodes"] * cfg["cluster"]["ranks_per_node"]
        medians[(world, cfg["compression"]["scheme"])] = statistics.median(steady)
    assert set(got.index) == set(medians)
    for (world, scheme), value in medians.items():
        base = medians[(world, "none")]
        assert got.loc[(world, scheme), "samples_gain_pct"] == pytest.approx(
            (value / base - 1) * 100)


def test_truncated_metrics_line_is_counted_not_fatal(tmp_path: Path):
    src = next((FIXTURES / "runs" / "local_compare").iterdir())
    run_dir = tmp_path / "results" / "cut" / src.name
    shutil.copytree(src, run_dir)
    (run_dir / "summary.json").unlink()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 21, "iteration_s": 0.4, "loss"')
    run = load_run(run_dir)
    assert run.row["steps_done"] == 20 and run.row["malformed_lines"] == 1


def test_collect_cli_without_runs_says_what_to_do(tmp_path: Path, capsys):
    assert collect.main(["--exp", "nothing", "--results", str(tmp_path)]) == 2
    assert "make run EXP=nothing" in capsys.readouterr().err


def test_comparison_members_come_from_the_experiment_file(tmp_path: Path):
    (tmp_path / "cmp.yaml").write_text("# @package _global_\nexperiment: cmp\n"
                                       "runs: [local_baseline, local_naive]\n")
    assert collect.comparison_members("cmp", tmp_path) == ["local_baseline", "local_naive"]
    assert collect.comparison_members("absent", tmp_path) == []


def test_runs_csv_round_trips_the_status_column(fixture_results: Path):
    collect.collect("local_compare", fixture_results)
    csv = pd.read_csv(fixture_results / "tables" / "local_compare.runs.csv")
    assert sorted(csv["status"].unique()) == ["completed", "failed", "running"]


def test_a_planned_run_without_steps_still_gives_typed_tables(tmp_path: Path):
    src = next((FIXTURES / "runs" / "local_compare").iterdir())
    run_dir = tmp_path / "results" / "planned" / src.name
    run_dir.mkdir(parents=True)
    for name in ("config.json", "layout.json"):
        shutil.copy(src / name, run_dir / name)
    (run_dir / "status.json").write_text('{"state": "planned", "world_size": 8}')
    tables = collect.collect("planned", tmp_path / "results")
    assert tables["runs"]["status"].tolist() == ["planned"]
    assert tables["steps"].empty and {"run_id", "step", "loss_smooth"} <= set(tables["steps"])
    assert tables["compare"].empty
