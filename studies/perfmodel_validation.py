"""The performance model against this machine: calibrated once, then asked to predict the
measured step time of local layouts it was not fitted on (different tp/pp/dp, micro-batch,
model, rank count and compression scheme); prints the error of each (goal: within 20 %).

    .venv/bin/python studies/perfmodel_validation.py     # about 5 minutes

A benchmark, not a test: its numbers depend on how loaded the machine is. The test suite
keeps the model's deterministic checks (tests/unit/test_perfmodel.py).

Calibration and validation run back to back in this one test, because the machine is
shared: the threads of other jobs competing for the cores during each run's steps are
measured (from the kernel's schedstat of our ranks, perfmodel.stretch) and given to the
model as an input, like the layout; they are never fitted to step times.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from neoxlab.commands.calibrate import (
    CALIBRATION_RUNS,
    CALIBRATION_SETTINGS,
    calibrate,
    measured_run,
    write,
)
from neoxlab.config.compose import compose_experiment
from neoxlab.metrics import summarize
from neoxlab.perfmodel.predict import predict
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.perfmodel.stretch import Sampler
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


def measure(results, name: str, overrides: list[str]) -> tuple:
    """One real run (its own run dir) and the other jobs' threads measured during its steps."""
    run_dir, external = measured_run(results / name, overrides, timeout=400)
    cfg = rundir.load_config(run_dir)
    records = read_metrics(run_dir)
    median = summarize(records, cfg.train.metrics_warmup_steps)["median_iteration_s"]
    if median != json.loads((run_dir / "summary.json").read_text())["median_iteration_s"]:
        print(f"note: {name}: summary.json's median differs from metrics.jsonl's")
    return cfg, run_dir, median, external


def main() -> int:
    sampler_probe()
    workdir = Path(tempfile.mkdtemp(prefix="neoxlab-perfmodel-"))
    results = workdir / "results"
    print(f"\nruns and calibration under {results} (removed when the test passes)")
    base = compose_experiment("local_3d", [f"launch.results_dir={results}"])
    fitted = [measure(results, name, [*CALIBRATION_SETTINGS, *o])
              for name, o in CALIBRATION_RUNS.items()]
    doc = calibrate(base.cluster.profile, [(d, k) for _, d, _, k in fitted])
    write(doc, results / base.cluster.profile.calibration)
    resolved = resolve_profile(base)  # what a local prediction now uses: the file just written
    rows = []
    for name, overrides in VALIDATION.items():
        cfg, _, measured, external = measure(results, name, overrides)
        pred = predict(cfg, resolved.profile, resolved.origin, external=external)
        rows.append((name, cfg, measured, external, pred))
    print(f"profile: {resolved.origin}")
    p = resolved.profile
    print(f"fitted: achievable {p.achievable_tflops * 1e3:.2f} GFLOPS/core, layer overhead "
          f"{p.layer_overhead_us:.0f} us, step overhead {p.step_overhead_us:.0f} us; gloo "
          f"alpha {p.intra.latency_us:.0f} us, B {p.intra.bandwidth_gbs:.3f} GB/s (per core)")
    for run in doc["measured"]["runs"]:
        print(f"  calibration run {run['run_dir'].split('/')[-3]}: other threads "
              f"{run['external']:.2f}, "
              f"measured {run['measured_step_s']:.4f} s, fitted {run['fitted_step_s']:.4f} s")
    head = (f"{'layout (not fitted)':<22}{'ranks':>6}{'scheme':>8}{'others':>8}{'bound':>15}"
            f"{'measured s':>12}{'predicted s':>12}{'error':>8}")
    print(head + "\n" + "-" * len(head))
    bad = []
    for name, cfg, measured, external, pred in rows:
        error = pred.step_s / measured - 1
        print(f"{name:<22}{pred.gpus:>6}{cfg.compression.scheme:>8}{external or 0:>8.2f}"
              f"{pred.bound:>15}{measured:>12.4f}{pred.step_s:>12.4f}{error:>+8.1%}")
        if abs(error) > BOUND:
            bad.append(f"{name}: measured {measured:.4f} s, predicted {pred.step_s:.4f} s")
    rundir.write_json(results / "validation.json", [
        {"layout": name, "experiment_overrides": VALIDATION[name], "external": external,
         "measured_step_s": measured, "prediction": pred.row()}
        for name, _, measured, external, pred in rows])
    if bad:
        print(f"outside +-{BOUND:.0%}: {bad} (runs kept in {results})")
        return 0
    print(f"every layout within +-{BOUND:.0%}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
