"""The performance model against this machine: calibrated once, then asked to predict the
measured step time of local layouts it was not fitted on (different tp/pp/dp, micro-batch,
model, rank count and compression scheme); prints the error of each (goal: within 20 %).

    .venv/bin/python studies/perfmodel_validation.py     # about 5 minutes
    .venv/bin/python studies/perfmodel_validation.py \
        --data docs/measurements/data/<date>-perfmodel-validation.runs.jsonl
    .venv/bin/python studies/perfmodel_validation.py --from-data docs/measurements/data/<...>

--data writes every run's row (results/rundata.py: config, every step's time, bytes; with
its measured median step and the other jobs' threads during it) and the calibration document
the runs fitted; --from-data predicts every layout again from that file alone (the profile
the document holds, the overrides and load each row holds) and prints the same table.

A benchmark, not a test: its numbers depend on how loaded the machine is. The test suite
keeps the model's deterministic checks (tests/unit/test_perfmodel.py).

Calibration and validation run back to back in this one test, because the machine is
shared: the threads of other jobs competing for the cores during each run's steps are
measured (from the kernel's schedstat of our ranks, perfmodel.stretch) and given to the
model as an input, like the layout; they are never fitted to step times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from neoxlab.commands.calibrate import (
    CALIBRATION_RUNS,
    CALIBRATION_SETTINGS,
    RUN_SETTINGS,
    calibrate,
    measured_run,
    write,
)
from neoxlab.config.compose import compose_experiment
from neoxlab.metrics import summarize
from neoxlab.perfmodel.predict import predict
from neoxlab.perfmodel.resolve import Resolved, resolve_profile
from neoxlab.perfmodel.stretch import Sampler
from neoxlab.results import rundata
from neoxlab.run import rundir

BOUND = 0.20
RANKS4 = ["cluster.ranks_per_node=4"]
# fitted: calibrate.CALIBRATION_RUNS (neox_small data parallel on 4 ranks: micro-batches of
# 1 and 4 for the FLOP rate and the per-layer cost, 2 micro-batches for the per-step cost)
# never fitted on: tensor and pipeline parallel layouts, other micro-batch sizes and counts,
# an unbalanced pipeline (6 layers on 4 stages), 8 ranks, a compression scheme; neox_small
# as in calibration (tiny models are almost all framework overhead)
SMALL = ["model=neox_small"]
VALIDATION = {
    "tp2_pp2_mb2_ga4": [*SMALL, "parallel.tp=2", "parallel.pp=2", "parallel.micro_batch=2",
                        "parallel.grad_accum=4", *RANKS4],
    "pp2_dp2_mb3_ga2": [*SMALL, "parallel.tp=1", "parallel.pp=2", "parallel.micro_batch=3",
                        "parallel.grad_accum=2", *RANKS4],
    "tp2_dp2_mb2_ga2": [*SMALL, "parallel.tp=2", "parallel.pp=1", "parallel.micro_batch=2",
                        "parallel.grad_accum=2", *RANKS4],
    "pp4_mb1_ga8": [*SMALL, "parallel.tp=1", "parallel.pp=4", "parallel.micro_batch=1",
                    "parallel.grad_accum=8", *RANKS4],
    "tp2_pp2_dp2_8ranks": [*SMALL, "parallel.tp=2", "parallel.pp=2", "parallel.micro_batch=1",
                           "parallel.grad_accum=4"],
    "naive_tp2_pp2_mb2": [*SMALL, "parallel.tp=2", "parallel.pp=2", "parallel.micro_batch=2",
                          "parallel.grad_accum=4", "compression=naive", *RANKS4],
}


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def sampler_probe() -> None:
    """The load sampler sees a rank's helper thread apart from its main thread: a stand-in
    rank whose main thread sleeps while a helper spins for 2 s (expect helpers > 0.2 and
    runnable < helpers; on a busy machine the helper gets less than a core)."""
    code = ("import threading, time\n"
            "end = time.time() + 2.0\n"
            "def spin():\n"
            "    while time.time() < end: pass\n"
            "threading.Thread(target=spin).start()\n"
            "while time.time() < end: time.sleep(0.05)\n")
    with Sampler("neoxlab-helper-probe", interval=0.05) as sampler:
        subprocess.run([sys.executable, "-c", code, "neoxlab-helper-probe"], timeout=30,
                       check=True)
    load = sampler.load()
    verdict = "ok" if load and load.helpers > 0.2 and load.runnable < load.helpers else "OFF"
    print(f"sampler probe: {load} -> {verdict}")


def measure(results: Path, name: str, overrides: list[str]) -> dict:
    """One real run (its own run dir) and the other jobs' threads measured during its steps."""
    run_dir, external = measured_run(results / name, overrides, timeout=400)
    cfg = rundir.load_config(run_dir)
    records = read_metrics(run_dir)
    median = summarize(records, cfg.train.metrics_warmup_steps)["median_iteration_s"]
    if median != json.loads((run_dir / "summary.json").read_text())["median_iteration_s"]:
        print(f"note: {name}: summary.json's median differs from metrics.jsonl's")
    return {"layout": name, "overrides": overrides, "run_dir": str(run_dir),
            "measured_step_s": median, "external": external}


def resolved_from(doc: dict, results: Path) -> Resolved:
    """The local profile with a calibration document: what a local prediction uses once the
    document is written under `results` (as a calibration run leaves it)."""
    base = compose_experiment("local_3d", [f"launch.results_dir={results}"])
    write(doc, results / base.cluster.profile.calibration)
    return resolve_profile(base)


def point_config(overrides: list[str]):
    """A validation layout's config: local_3d with the runs' settings (measured_run's)."""
    return compose_experiment("local_3d", [*RUN_SETTINGS, *overrides])


def data_rows(doc: dict, calibration: Path, measured: list[dict]) -> list[dict]:
    """The --data file's rows: every validation run's (rundata) with what the table takes from
    it, every calibration run's, and the calibration document they fitted."""
    fitted = [rundata.run_row(Path(r["run_dir"]), role="calibration", external=r["external"],
                              measured_step_s=r["measured_step_s"])
              for r in doc["measured"].get("runs", [])]
    return [*fitted,
            *(rundata.run_row(Path(m["run_dir"]), role="validation", layout=m["layout"],
                              overrides=m["overrides"], external=m["external"],
                              measured_step_s=m["measured_step_s"]) for m in measured),
            {"role": "calibration_document", "run_dir": str(calibration), "document": doc}]


def from_data(path: Path) -> list[str]:
    """The table again from a --data file alone; the layouts outside the bound."""
    data = rundata.read(path)
    (doc,) = [r["document"] for r in data if r["role"] == "calibration_document"]
    measured = [r for r in data if r["role"] == "validation"]
    with tempfile.TemporaryDirectory(prefix="neoxlab-perfmodel-") as tmp:
        resolved = resolved_from(doc, Path(tmp))
    return report(doc, resolved, measured)


def report(doc: dict, resolved: Resolved, measured: list[dict]) -> list[str]:
    """Every layout predicted from the calibrated profile and its measured load; prints the
    fit and the table, returns the layouts outside the bound."""
    p = resolved.profile
    print(f"profile: {p.source}")
    print(f"fitted: achievable {p.achievable_tflops * 1e3:.2f} GFLOPS/core, layer overhead "
          f"{p.layer_overhead_us:.0f} us, step overhead {p.step_overhead_us:.0f} us; gloo "
          f"alpha {p.intra.latency_us:.0f} us, B {p.intra.bandwidth_gbs:.3f} GB/s (per core)")
    for run in doc["measured"].get("runs", []):
        print(f"  calibration run {run['run_dir'].split('/')[-3]}: other threads "
              f"{run['external'] or 0:.2f}, "
              f"measured {run['measured_step_s']:.4f} s, fitted {run['fitted_step_s']:.4f} s")
    head = (f"{'layout (not fitted)':<22}{'ranks':>6}{'scheme':>8}{'others':>8}{'bound':>15}"
            f"{'measured s':>12}{'predicted s':>12}{'error':>8}")
    print(head + "\n" + "-" * len(head))
    bad = []
    for m in measured:
        cfg = point_config(m["overrides"])
        pred = predict(cfg, p, resolved.origin, external=m["external"])
        measured_s = m["measured_step_s"]
        error = pred.step_s / measured_s - 1
        print(f"{m['layout']:<22}{pred.gpus:>6}{cfg.compression.scheme:>8}"
              f"{m['external'] or 0:>8.2f}{pred.bound:>15}{measured_s:>12.4f}"
              f"{pred.step_s:>12.4f}{error:>+8.1%}")
        if abs(error) > BOUND:
            bad.append(f"{m['layout']}: measured {measured_s:.4f} s, predicted "
                       f"{pred.step_s:.4f} s")
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="write every run's row and the calibration document here")
    parser.add_argument("--from-data", type=Path, default=None,
                        help="no runs: the table of a data file")
    args = parser.parse_args()
    if args.from_data is not None:
        bad = from_data(args.from_data)
        print(f"outside +-{BOUND:.0%}: {bad}" if bad else f"every layout within +-{BOUND:.0%}")
        return 0
    sampler_probe()
    workdir = Path(tempfile.mkdtemp(prefix="neoxlab-perfmodel-"))
    results = workdir / "results"
    print(f"\nruns and calibration under {results} (removed when the test passes)")
    base = compose_experiment("local_3d", [f"launch.results_dir={results}"])
    fitted = [measure(results, name, [*CALIBRATION_SETTINGS, *o])
              for name, o in CALIBRATION_RUNS.items()]
    doc = calibrate(base.cluster.profile, [(Path(m["run_dir"]), m["external"]) for m in fitted])
    resolved = resolved_from(doc, results)  # what a local prediction now uses
    measured = [measure(results, name, overrides) for name, overrides in VALIDATION.items()]
    if args.data is not None:
        rundata.append(args.data, data_rows(
            doc, results / base.cluster.profile.calibration, measured))
    bad = report(doc, resolved, measured)
    rundir.write_json(results / "validation.json", measured)
    if bad:
        print(f"outside +-{BOUND:.0%}: {bad} (runs kept in {results})")
        return 0
    print(f"every layout within +-{BOUND:.0%}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
