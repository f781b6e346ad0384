"""Each study's --data file and its --from-data (results/rundata.py): the tables printed from
the file alone are the ones the study printed from its runs (a round trip through the study's
own writer and reader, so a field the writer drops or the reader misreads fails)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from neoxlab.results import rundata

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def study(name: str):
    if str(STUDIES) not in sys.path:  # as `python studies/<name>.py` has it: helpers by name
        sys.path.insert(0, str(STUDIES))
    spec = importlib.util.spec_from_file_location(name, STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(root: Path, name: str, losses: list[float], step_s: float = 0.5) -> Path:
    """A run dir as a training run leaves it (the parts rundata.run_row reads)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": v, "iteration_s": step_s + 0.01 * i,
                    "samples_per_s": 8 / step_s}) + "\n" for i, v in enumerate(losses)))
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
    import dataclasses

    from neoxlab.config.compose import compose_experiment

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
