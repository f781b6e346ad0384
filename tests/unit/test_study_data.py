"""Each study's --data file and its --from-data (results/rundata.py): the tables printed from
the file alone are the ones the study printed from its runs (a round trip through the study's
own writer and reader, so a field the writer drops or the reader misreads fails)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from neoxlab.compress.registry import calibration_specs
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile
from neoxlab.perfmodel import emulated as em
from neoxlab.perfmodel.fit import BANDWIDTH_BENCHMARKS, steps_and_bytes
from neoxlab.results import rundata

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def study(name: str):
    if str(STUDIES) not in sys.path:  # as `python studies/<name>.py` has it: helpers by name
        sys.path.insert(0, str(STUDIES))
    spec = importlib.util.spec_from_file_location(name, STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def fake_run(root: Path, name: str, losses: list[float], step_s: float = 0.5,
             speeds: list[float] | None = None, config: dict | None = None) -> Path:
    """A run dir as a training run leaves it (the parts rundata.run_row reads)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    speeds = speeds or [8 / step_s] * len(losses)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": v, "iteration_s": step_s + 0.01 * i,
                    "samples_per_s": w}) + "\n"
        for i, (v, w) in enumerate(zip(losses, speeds, strict=True))))
    (run_dir / "config.json").write_text(json.dumps(config or {}))
    (run_dir / "summary.json").write_text(json.dumps(
        {"comm": {"dp": {"bytes_in": 100, "bytes_out": 40, "calls": 3}},
         "final_loss": losses[-1]}))
    return run_dir


def test_loss_study_tables_come_back_from_its_data_file(tmp_path, capsys):
    loss_study = study("loss_study")
    rng = np.random.default_rng(0)
    steps = 40
    base = np.linspace(5.0, 3.0, steps)
    done = {}
    for seed in (1, 2, 3):
        for k, scheme in enumerate(("none", "naive", "zhybrid")):
            curve = base + rng.normal(0, 0.05, steps) + 0.02 * k * seed
            done[(scheme, seed)] = fake_run(tmp_path / "runs", f"{scheme}-{seed}",
                                            curve.tolist())
    path = tmp_path / "data" / "loss.runs.jsonl"
    rundata.append(path, loss_study.data_rows(done))
    capsys.readouterr()
    live_rows, live_verdict = loss_study.report(loss_study.losses_of_runs(done),
                                                ["none", "naive", "zhybrid"], [1, 2, 3])
    live = capsys.readouterr().out
    data = loss_study.losses_of_data(path)
    again_rows, again_verdict = loss_study.report(data, ["none", "naive", "zhybrid"], [1, 2, 3])
    assert capsys.readouterr().out == live
    assert again_rows == live_rows and again_verdict == live_verdict
    # the table's cells are the runs' smoothed final losses, seed by seed
    naive_2 = loss_study.smooth(np.array([json.loads(line)["loss"] for line in (
        done[("naive", 2)] / "metrics.jsonl").read_text().splitlines()]))[-1]
    (line,) = [x for x in live.splitlines() if x.startswith("| naive |")]
    assert line.split(" | ")[2] == f"{naive_2:.4f}"


def test_perfmodel_validation_table_comes_back_from_its_data_file(tmp_path, capsys):
    """The calibration document and each layout's measured step and load go to the file; the
    table predicted again from it alone is the one printed after the runs."""
    validation = study("perfmodel_validation")
    base = compose_experiment("local_3d", []).cluster.profile
    fitted = dataclasses.replace(base, calibration=None, achievable_tflops=0.061,
                                 layer_overhead_us=5200.0, source="calibrated in a test")
    calib_run = fake_run(tmp_path / "results" / "dp4_mb1" / "local_3d", "run1", [5.0, 4.9])
    doc = {"profile": json.loads(json.dumps(dataclasses.asdict(fitted))),
           "measured": {"runs": [{"run_dir": str(calib_run), "external": 0.1,
                                  "measured_step_s": 0.4, "fitted_step_s": 0.41}]}}
    measured = []
    for k, (name, overrides) in enumerate(list(validation.VALIDATION.items())[:3]):
        run_dir = fake_run(tmp_path / "results" / name, "run", [5.0, 4.8, 4.7])
        measured.append({"layout": name, "overrides": overrides, "run_dir": str(run_dir),
                         "measured_step_s": 0.4 + 0.1 * k, "external": 0.2 * k or None})
    path = tmp_path / "perfmodel.runs.jsonl"
    rundata.append(path, validation.data_rows(doc, tmp_path / "calibration.json", measured))
    live_bad = validation.report(doc, validation.resolved_from(doc, tmp_path / "live"),
                                 measured)
    live = capsys.readouterr().out
    assert validation.from_data(path) == live_bad
    again = capsys.readouterr().out
    assert again == live
    assert "61.00 GFLOPS/core" in live  # the document's profile, not the YAML's
    rows = [x.split() for x in live.splitlines() if x.split()[:1] in ([m["layout"]]
                                                                     for m in measured)]
    assert [r[-3] for r in rows] == [f"{m['measured_step_s']:.4f}" for m in measured]


def omb_rows(per_flow_gbs: float, nodes: int) -> list[dict]:
    """An emulated_omb run's all-reduce and all-gather rows on a link of this bandwidth a
    flow, alpha 2 ms (as read_omb leaves them)."""
    rows = []
    for benchmark in BANDWIDTH_BENCHMARKS:
        for size in (4096 << k for k in range(11)):  # up to 4 MiB
            steps, wire = steps_and_bytes(benchmark, nodes, size)
            rows.append({"benchmark": benchmark, "size": size,
                         "avg_us": (steps * 2e-3 + wire / (per_flow_gbs * 1e9)) * 1e6})
    return rows


def test_emulated_model_fits_and_predicts_again_from_its_data_file(tmp_path, capsys):
    """The model's inputs (omb rows, sweep rows with the fit-rate runs' codec seconds, the
    local profile, the codec timings) go to the file; fitted and predicted again from it
    alone, every table is the one the study printed from its inputs."""
    model = study("emulated_model")
    omb, dirs = {}, {}
    for rate, bare in (("none", 0.03), ("200", None), ("10", None)):
        for flows in (1, 2):
            per_flow = (bare if bare else 0.8 * float(rate) / 8e3) / flows
            omb[rate, flows, 2] = [omb_rows(per_flow * f, 2) for f in (0.95, 1.05)]
            dirs[rate, flows, 2] = [f"/gone/omb-{rate}-{flows}-{k}" for k in (1, 2)]
    base = em.local_profile(tmp_path / "nowhere")[0]
    codecs = base.codecs | {n: CodecProfile(encode_gbs=0.3, decode_gbs=0.4, call_us=50.0)
                            for n in calibration_specs()}
    measured = []
    for rate, speed in (("none", 1.0), ("200", 0.9), ("40", 0.5), ("10", 0.2)):
        for scheme, gain in (("none", 0.0), ("naive", 0.1 if rate in ("40", "10") else -0.2)):
            row = {"layout": "2x2", "rate_mbit": rate, "scheme": scheme,
                   "samples_per_s": str(speed * (1 + gain)), "comm_share": "0.6",
                   "gain_samples": str(gain), "external": "0.3",
                   "run_dir": f"/gone/sweep-{rate}-{scheme}"}
            if scheme != "none" and rate != "40":
                row["codec_s_per_step"] = 0.7
            measured.append(row)
    inputs = model.Inputs(omb, dirs, base, "the local profile (test)", codecs, measured)
    args = argparse.Namespace(fit_rates=["none", "200", "10"], model="neox_small",
                              one_thread_codecs=False)
    path = tmp_path / "model.jsonl"
    rundata.append(path, model.data_rows(inputs, tmp_path / "emulated.json", args))
    rates = [10.0, 60.0, 400.0]
    capsys.readouterr()
    live_rows = model.model(inputs, tmp_path / "live", args, curve_rates=rates)
    live = capsys.readouterr().out
    again, prof = model.data_inputs(path)
    assert prof["fit_rates"] == args.fit_rates and prof["model"] == args.model
    assert model.model(again, tmp_path / "again", args, calibrate=False,
                       curve_rates=rates) == live_rows
    assert capsys.readouterr().out == live
    for table in ("model", "curves", "crossover"):
        name = f"emulated_sweep.{table}.csv"
        assert (tmp_path / "again" / "tables" / name).read_text() == \
            (tmp_path / "live" / "tables" / name).read_text()
    assert [r["rate_mbit"] for r in live_rows if r["held_out"]] == ["40", "40"]
    assert "codecs " in live  # the codec scale was fitted to the runs' codec seconds


def test_flover_tables_and_ratios_come_back_from_its_data_file(tmp_path, capsys):
    """Rows shaped as the serving runner gives them (serve.runner.run_all) at two gaps."""
    flover = study("flover")
    rows = [{"gap_ms": gap, "policy": policy, "requests": 4, "output_tokens": 40,
             "total_s": total, "cpu_s": total / 2, "tokens_per_s": 40 / total,
             "latency_mean_s": total / 2, "latency_p50_s": total / 2, "latency_p99_s": total,
             "ttft_mean_s": 0.01, "tpot_mean_s": total / 40, "rows": n, "fused_steps": 5,
             "model": "gpt-neox (ours)"}
            for gap in (20.0, 100.0)
            for policy, total, n in (("fused", 0.5, 40), ("sequential", 4.5, 40),
                                     ("fused_noreorder", 0.9, 64))]
    tuning = [{"pages": 8, "probe_tok_s": 31.5}]
    sizing = {"pages": 8, "page_size": 32}
    args = argparse.Namespace(layers=1, hidden=32, gap_ms=[20.0, 100.0])
    path = tmp_path / "flover.jsonl"
    rundata.write(path, flover.data_rows(args, rows, tuning, sizing, "sdpa"))
    flover.report(rows, tuning, sizing)
    live = capsys.readouterr().out
    flover.from_data(path)
    assert capsys.readouterr().out == "decode attention: sdpa\n" + live
    # the ratios are the rows' own: sequential's total time over fused's, at each gap
    assert live.count("fused_vs_sequential_total_time: 9.00x") == 2
    assert "fused_vs_noreorder_total_time: 1.80x" in live


def test_tune_online_pairs_come_back_from_their_data_file(tmp_path, capsys):
    """A changed run (uplinks drop after step 10, the re-check sees it at 12 and switches at
    14) and a run tuned for 40 Mbit/s: the pair's result from the file is the one from the
    runs, its re-tune 4 steps after the drop and its speeds the medians on either side."""
    online = study("tune_online_emulated")
    steps = 20
    changed_speeds = [1.0] * 10 + [0.3] * 4 + [0.8 + 0.01 * i for i in range(6)]
    changed = fake_run(tmp_path, "changed", [5.0] * steps, speeds=changed_speeds,
                       config={"train": {"steps": steps}})
    tuned = fake_run(tmp_path, "tuned", [5.0] * steps, speeds=[0.5, 0.6] + [0.9] * 18,
                     config={"train": {"steps": steps}})
    dim = {"changed": False}
    rechecks = [{"step": 8, "switches": {}, "dims": [dim]},
                {"step": 12, "switches": {}, "dims": [{"changed": True}]},
                {"step": 14, "switches": {"dp": "int8"}, "dims": [{"changed": True}]}]
    (changed / "tune_online.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rechecks))
    path = tmp_path / "online.runs.jsonl"
    for pair in (1, 2):
        rundata.append(path, [{**r, "run_dir": f"{r['run_dir']}-{pair}"} for r in
                              online.pair_rows(changed, tuned, pair, 10, 2)])
    live = online.pair_result(*online.pair_rows(changed, tuned, 1, 10, 2), steps=steps)
    again = online.pairs_from_data(path)
    assert [{**r, "changed_run": live["changed_run"], "tuned_for_40_run": live["tuned_for_40_run"]}
            for r in again] == [live, live]
    assert live["change_seen_at"] == 12 and live["switched_at"] == 14
    assert live["steps_to_retune"] == 4
    assert live["samples_per_s_after"] == np.median(changed_speeds[14:])
    assert live["samples_per_s_tuned_for_40"] == 0.9
    assert online.summary(again) == 0
    assert "summary: 2 pairs; steps to the re-tune [4, 4]" in capsys.readouterr().out
