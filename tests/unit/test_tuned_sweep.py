"""The goals the tuner's pick is held to on the emulated sweep (studies/sweep_runs.py) and the
regret study's ranking measure (studies/tune_regret.py), on small fixtures."""

import csv
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from neoxlab.perfmodel.wire import HEADER_BYTES

STUDIES = Path(__file__).resolve().parents[2] / "studies"
sys.path.insert(0, str(STUDIES))  # as `python studies/<name>.py` has it: its helpers by name
import sweep_runs as sweep  # noqa: E402

STUDY = STUDIES / "tune_regret.py"
spec = importlib.util.spec_from_file_location("tune_regret", STUDY)
tune_regret = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune_regret)


def row(scheme: str, speed: float, rate: str = "40", comm: float = 0.95, **extra) -> dict:
    # as csv.DictReader gives them: strings
    return {"layout": "2x2", "rate_mbit": rate, "scheme": scheme, "samples_per_s": str(speed),
            "baseline_comm_share": str(comm), **{k: str(v) for k, v in extra.items()}}


def test_the_pick_is_held_to_the_best_fixed_scheme_its_prediction_and_its_bytes():
    rows = [row("none", 0.25), row("naive", 0.90), row("zhybrid", 0.47), row("mzhybrid", 0.46),
            row("tuned", 0.88, step_s=4.0, predicted_step_s=4.5,
                uplink_payload_bytes_per_step=1.0e6,
                predicted_uplink_payload_bytes_per_step=1.04e6)]
    (check,) = sweep.tuned_checks(rows)
    assert check["best_fixed"] == "naive"
    assert check["vs_best_fixed"] == pytest.approx(0.88 / 0.90)
    assert check["ok_throughput"]  # 0.978 >= 0.97
    assert check["prediction_error"] == pytest.approx(0.125) and check["ok_prediction"]
    assert check["bytes_error"] == pytest.approx(0.04) and check["ok_bytes"]

    slow = [*rows[:4], row("tuned", 0.85, step_s=4.0, predicted_step_s=3.0)]
    (check,) = sweep.tuned_checks(slow)
    assert not check["ok_throughput"]  # 0.944x naive
    assert not check["ok_prediction"]  # -25 %
    assert not check["ok_bytes"]  # nothing predicted: not a pass


def test_beating_naive_counts_only_points_where_the_baseline_mostly_communicates():
    checks = [{"baseline_comm_share": 0.95, "vs_naive": 1.12},
              {"baseline_comm_share": 0.92, "vs_naive": 1.05},
              {"baseline_comm_share": 0.98, "vs_naive": 1.10},
              {"baseline_comm_share": 0.80, "vs_naive": 1.50}]  # not communication-bound
    assert sweep.naive_beaten(checks) == (2, 3)


def test_a_point_without_a_tuned_row_has_no_check():
    assert sweep.tuned_checks([row("none", 1.0), row("naive", 1.2)]) == []


def fake_run(path: Path, steps: int, carried: float, packets: int) -> Path:
    """A run dir whose two uplinks carried `carried` bytes of payload in `packets` packets."""
    path.mkdir()
    network = {"ranks_per_node": 2, "nodes": 2, "uplinks": {
        n: {"tx_bytes": carried / 2 + HEADER_BYTES * packets / 2, "tx_packets": packets / 2}
        for n in ("n0", "n1")}}
    (path / "network.json").write_text(json.dumps(network))
    (path / "metrics.jsonl").write_text("\n".join(json.dumps({"step": i})
                                                  for i in range(1, steps + 1)))
    return path


def test_the_steps_uplink_payload_leaves_out_start_up_traffic_and_headers(tmp_path):
    """Start-up traffic the accounting never sees (the TCP store, connections) cancels
    between a run and a shorter one; headers are not payload."""
    start_up, step = 74_000, 131_000
    run = fake_run(tmp_path / "run", 5, start_up + 5 * step, packets=900)
    short = fake_run(tmp_path / "short", 3, start_up + 3 * step, packets=600)
    assert sweep.step_uplink_payload(run, short) == pytest.approx(step)
    # over one run, the start-up traffic is 11 % of this step's payload
    assert sweep.carried_payload(run) / 5 > 1.1 * step
    with pytest.raises(ValueError, match="not more than the short run"):
        sweep.step_uplink_payload(short, run)


def test_kendall_tau_is_one_for_the_same_order_and_minus_one_for_the_reverse():
    predicted = [1.0, 2.0, 3.0, 4.0]
    assert tune_regret.kendall_tau(predicted, [10, 20, 30, 40]) == 1.0
    assert tune_regret.kendall_tau(predicted, [40, 30, 20, 10]) == -1.0
    # one swapped neighbour pair of 6 pairs: (5 - 1) / 6
    assert tune_regret.kendall_tau(predicted, [10, 30, 20, 40]) == pytest.approx(4 / 6)


def test_regret_is_the_picks_measured_speed_over_the_best_measured():
    runs = [{"layout": "2x2", "rate_mbit": "40", "label": name, "chosen": name == "pick",
             "samples_per_s": speed, "step_s": 1 / speed, "predicted_step_s": pred}
            for name, speed, pred in (("pick", 0.96, 1.0), ("best", 1.0, 1.1),
                                      ("none", 0.2, 5.0))]
    (v,) = tune_regret.verdicts(runs)
    assert v["pick"] == "pick" and v["best"] == "best"
    assert v["pick_over_best"] == pytest.approx(0.96)
    assert v["kendall_tau"] == pytest.approx(1 / 3)  # pick and best predicted in reverse


def test_the_table_keeps_every_rows_columns_when_the_pick_has_more(tmp_path):
    path = tmp_path / "sweep.csv"
    sweep.write([{"layout": "2x2", "rate_mbit": "40", "scheme": "none", "samples_per_s": 1}],
                path)
    sweep.write([{"layout": "2x2", "rate_mbit": "40", "scheme": "naive", "samples_per_s": 2},
                 {"layout": "2x2", "rate_mbit": "40", "scheme": "tuned", "samples_per_s": 3,
                  "uplink_payload_bytes_per_step": 7}], path)
    with path.open() as f:
        got = list(csv.DictReader(f))
    assert [r["scheme"] for r in got] == ["none", "naive", "tuned"]
    assert [r["uplink_payload_bytes_per_step"] for r in got] == ["", "", "7"]


def test_best_fixed_is_the_best_of_every_fixed_scheme_int8_included():
    """Issue 54: with a fixed int8 scheme measured beside the ZFP ones, a pick as fast as
    naive but slower than fixed int8 misses the 0.97x goal."""
    rows = [row("none", 0.25), row("naive", 0.90), row("zhybrid", 0.47), row("int8", 1.10),
            row("fp16", 0.60), row("tuned", 0.90, step_s=4.0)]
    (check,) = sweep.tuned_checks(rows)
    assert check["best_fixed"] == "int8" and not check["ok_throughput"]


def test_the_fixed_set_has_a_scheme_per_codec_family_the_tuner_may_pick():
    """Every codec family of tune.codecs that can pass the guard's budgets (not top-k, mpc
    lossless aside) is compared as a fixed scheme on every dimension, in the tune's table
    and on the emulated sweep."""
    from neoxlab.compress import parse_spec
    from neoxlab.config.compose import CONFIG_DIR, compose_experiment
    from neoxlab.tune.candidates import tune_codecs

    cfg = compose_experiment("tune_local")
    families = {parse_spec(c)[0] for c in tune_codecs(cfg)} - {"none", "mpc", "topk"}
    everywhere = {}
    for name in cfg.tune.compare:
        data = yaml.safe_load((CONFIG_DIR / "compression" / f"{name}.yaml").read_text())
        used = {d["compressor"] for d in data["dims"].values()}
        if len(used) == 1 and len(data["dims"]) == 4:
            everywhere[used.pop()] = name
    assert families <= set(everywhere), (families, everywhere)
    assert set(cfg.tune.compare) <= set(sweep.SCHEMES)


def test_the_sweep_table_is_rebuilt_from_its_data_file_alone(tmp_path):
    """studies/emulated_sweep.py --from-data: per point the median run of each scheme, its
    gain over the baseline's median, and the pick held to the best fixed (int8 here)."""
    spec_ = importlib.util.spec_from_file_location(
        "emulated_sweep", STUDY.parent / "emulated_sweep.py")
    study = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(study)

    def run(scheme: str, speed: float, n: int, **extra) -> dict:
        metrics = {"samples_per_s": speed, "tflops_per_gpu": speed / 10, "step_s": 8 / speed,
                   "comm_share": 0.9, "codec_share": 0.0, "uplink_MB_per_step": 1.0,
                   "final_loss": 5.0}
        return {"layout": "2x2", "rate_mbit": "40", "scheme": scheme, "repeat": n,
                "run_dir": f"/gone/{scheme}{n}", "metrics": metrics, "load": {"external": 0},
                **extra}

    pick = {"config": "tuned_x", "tune_dir": "/gone/tune", "uplink_payload_bytes": 2e6,
            "predicted_step_s": {"tuned": 9.0, "int8": 7.0}}
    rows = [run("none", 0.2, 1), run("none", 0.4, 2), run("none", 0.3, 3),
            run("int8", 1.2, 1), run("tuned", 1.0, 1, pick=pick,
                                     uplink_payload_bytes_per_step=2.1e6)]
    path = tmp_path / "sweep.runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = study.rows_from_data(path)
    assert [r["scheme"] for r in table] == ["none", "int8", "tuned"]
    assert table[0]["samples_per_s"] == 0.3 and table[0]["runs"] == 3  # the median run
    assert table[1]["gain_samples"] == pytest.approx(1.2 / 0.3 - 1)
    (check,) = sweep.tuned_checks(table)
    assert check["best_fixed"] == "int8" and check["vs_best_fixed"] == pytest.approx(1 / 1.2)
    assert check["bytes_error"] == pytest.approx(2e6 / 2.1e6 - 1)


def regret_row(rate: str, label: str, speed: float, predicted: float, repeat: int,
               chosen: bool = False) -> dict:
    """One run's row as tune_regret.py appends it (the run's own row left small)."""
    return {"layout": "2x2", "rate_mbit": rate, "mode": "neighbours", "label": label,
            "name": f"0x_{label}", "config": f"tuned_x_{label}", "tune_dir": "/gone/tune",
            "position": None, "predicted_step_s": predicted, "chosen": chosen,
            "baseline": False, "repeat": repeat, "run_dir": f"/gone/{rate}{label}{repeat}",
            "samples_per_s": speed, "step_s": 8 / speed, "external": 0.0,
            "run": {"run_id": f"{rate}{label}{repeat}", "steps": [1, 2, 3]}}


def test_the_regret_table_is_rebuilt_from_its_data_file_alone(tmp_path, capsys):
    """--from-data: per option the median of its 3 runs (an outlier run of the pick left
    out), the regret (best median over the pick's) and the rank agreement per rate."""
    speeds = {  # rate -> option -> (predicted step, samples/s of runs 1-3); pick first
        "200": {"pick": (1.0, (0.9, 1.0, 0.2)), "b": (1.1, (1.05, 0.95, 1.0)),
                "c": (1.2, (0.7, 0.8, 0.75)), "d": (1.3, (0.5, 0.6, 0.55))},
        "120": {"pick": (2.0, (0.5, 0.52, 0.51)), "b": (2.2, (0.45, 0.4, 0.44)),
                "c": (2.4, (0.3, 0.35, 0.33)), "d": (2.6, (0.2, 0.25, 0.22))}}
    rows = [regret_row(rate, label, runs[n], predicted, n + 1, chosen=label == "pick")
            for n in range(3) for rate, options in speeds.items()
            for label, (predicted, runs) in options.items()]
    path = tmp_path / "regret.runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tune_regret.main(["--from-data", str(path), "--results", str(tmp_path)]) == 0
    with (tmp_path / "tables" / "tune_regret.options.csv").open() as f:
        table = {(r["rate_mbit"], r["label"]): r for r in csv.DictReader(f)}
    assert len(table) == 8 and {r["runs"] for r in table.values()} == {"3"}
    assert float(table["200", "pick"]["samples_per_s"]) == 0.9  # not the 0.2 outlier
    assert float(table["200", "pick"]["samples_per_s_min"]) == 0.2
    assert [table["200", label]["measured_rank"] for label in ("b", "pick")] == ["1", "2"]
    with (tmp_path / "tables" / "tune_regret.csv").open() as f:
        points = {r["rate_mbit"]: r for r in csv.DictReader(f)}
    assert points["200"]["best"] == "b"
    assert float(points["200"]["regret"]) == pytest.approx(1.0 / 0.9)
    # pick and b measured in reverse of their prediction: 1 of 6 pairs swapped
    assert float(points["200"]["kendall_tau"]) == pytest.approx(4 / 6)
    assert float(points["120"]["regret"]) == 1.0 and float(points["120"]["kendall_tau"]) == 1.0
    printed = capsys.readouterr().out
    assert printed.count("**pick**") == 2 and "regret 1.111" in printed


def test_the_neighbour_runs_are_interleaved_and_a_second_call_runs_only_what_is_missing():
    todo = {rate: [{"layout": "2x2", "rate_mbit": rate, "mode": "neighbours", "label": label}
                   for label in ("pick", "b")] for rate in ("200", "120")}
    order = [(n, o["rate_mbit"], o["label"])
             for n, o in tune_regret.schedule(todo, 2, Counter())]
    assert order == [(1, "200", "pick"), (1, "120", "pick"), (1, "200", "b"), (1, "120", "b"),
                     (2, "200", "pick"), (2, "120", "pick"), (2, "200", "b"), (2, "120", "b")]
    done = Counter({("2x2", "200", "neighbours", "pick"): 2, ("2x2", "120", "neighbours", "b"): 1})
    order = [(n, o["rate_mbit"], o["label"]) for n, o in tune_regret.schedule(todo, 2, done)]
    assert order == [(1, "120", "pick"), (1, "200", "b"), (2, "120", "pick"), (2, "200", "b"),
                     (2, "120", "b")]


def test_the_neighbour_mode_runs_three_repeats_of_eight_steps_by_default():
    args = tune_regret.parse(["--neighbours", "3", "--rates", "200", "120"])
    assert (args.repeats, args.steps, args.export) == (3, 8, "tune.export_neighbours=3")
    args = tune_regret.parse(["--neighbours", "3", "--repeats", "5"])
    assert args.repeats == 5
    args = tune_regret.parse([])
    assert (args.repeats, args.steps, args.export) == (1, 5, "tune.export_ranked=12")
    with pytest.raises(SystemExit):
        tune_regret.parse(["--neighbours", "0"])


def test_a_second_call_goes_on_with_the_options_of_the_same_tune(tmp_path, monkeypatch):
    """A point with runs in the data file is not tuned again (a new tune may pick
    differently): its options are read back from the tune its runs name."""
    tune_dir = tmp_path / "tune"
    (tune_dir / "ranked").mkdir(parents=True)
    entries = [{"name": "01_pick", "label": "dp=int8", "predicted_step_s": 1.0, "chosen": True},
               {"name": "02_next", "label": "dp=bf16", "predicted_step_s": 1.2, "chosen": False}]
    (tune_dir / "ranked.json").write_text(json.dumps(entries))
    for e in entries:
        (tune_dir / "ranked" / f"{e['name']}.yaml").write_text(f"scheme: {e['name']}\n")
    (tmp_path / "configs" / "compression").mkdir(parents=True)
    monkeypatch.setattr(tune_regret, "REPO_ROOT", tmp_path)

    def tune_again(*args, **kwargs):
        raise AssertionError("tuned again")

    monkeypatch.setattr(tune_regret, "tune_point", tune_again)
    earlier = [{**regret_row("200", "dp=int8", 1.0, 1.0, 1, chosen=True),
                "tune_dir": str(tune_dir)}]
    got = tune_regret.options("2x2", "200", "neighbours", "tune.export_neighbours=3", earlier,
                              tune_regret.parse(["--neighbours", "3"]))
    assert [o["label"] for o in got] == ["dp=int8", "dp=bf16"]
    for o in got:
        path = tmp_path / "configs" / "compression" / f"{o['config']}.yaml"
        assert path.read_text() == f"scheme: {o['config']}\n"
    with pytest.raises(SystemExit, match="is gone"):
        tune_regret.options("2x2", "200", "neighbours", "x", [{**earlier[0],
                                                              "tune_dir": "/gone"}], None)


def test_a_faster_fixed_scheme_that_errs_more_than_naive_is_named_apart():
    """int4 runs faster than the pick but ends further from the uncompressed loss than naive
    does: the check still names it best fixed, and beside it the best fixed scheme no worse
    than naive in loss (int8 here), and the margin to int8."""
    rows = [row("none", 0.25, final_loss=4.0500), row("naive", 0.90, final_loss=4.0545),
            row("int8", 1.00, final_loss=4.0495), row("int4", 1.50, final_loss=4.0777),
            row("tuned", 1.10, step_s=4.0, final_loss=4.0497)]
    (check,) = sweep.tuned_checks(rows)
    assert check["best_fixed"] == "int4" and not check["ok_throughput"]
    assert check["best_within_naive_loss"] == "int8"
    assert check["vs_best_within_naive_loss"] == pytest.approx(1.10)
    assert check["vs_int8"] == pytest.approx(1.10)


def test_prediction_errors_cover_every_predicted_row_and_only_those():
    rows = [row("none", 0.25, step_s=4.0, predicted_step_s=3.0),
            row("naive", 0.90, step_s=2.0, predicted_step_s=2.5),
            row("zhybrid", 0.47, step_s=2.0)]
    errors = sweep.prediction_errors(rows)
    assert [e["scheme"] for e in errors] == ["none", "naive"]
    assert [e["error"] for e in errors] == pytest.approx([-0.25, 0.25])


def test_held_out_errors_are_summed_apart_from_the_development_points(capsys):
    spec_ = importlib.util.spec_from_file_location(
        "emulated_sweep_heldout", STUDY.parent / "emulated_sweep.py")
    study = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(study)
    rows = [row("none", 0.25, rate="200", step_s=4.0, predicted_step_s=4.2),
            row("none", 0.25, rate="120", step_s=4.0, predicted_step_s=8.0)]
    study.print_held_out(rows, {"2x2:200"})
    out = capsys.readouterr().out
    assert "| held out | 1 | 100.0% | 100.0% | 0 | +100.0% |" in out
    assert "| developed on | 1 | 5.0% | 5.0% | 1 | +5.0% |" in out
