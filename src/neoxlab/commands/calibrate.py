"""Calibrate the local profile from measurements on this machine; write it as JSON.

    python -m neoxlab.commands.calibrate [--results results] [--runs RUN_DIR ... | --no-runs]

Without --runs it launches CALIBRATION_RUNS itself (4 local ranks each, a few minutes).

1. links: alpha-beta of gloo (torch.distributed, what local training uses) and of MPI
   (mpi4py), each fitted to OSU-style sweeps of neoxlab.omb under mpiexec (all-reduce on
   2 and 4 ranks: t = 2(n-1) alpha + 2(n-1)/n M / B, least squares; ping-pong latency:
   t = alpha_p2p + M / B);
2. codecs: encode/decode throughput and per-call cost of the specs each codec names for
   calibration (compress.registry.calibration_specs: zfp at rates 8 and 24, mpc), timed in
   this process on one thread (the ranks' setting) at a small and a large message; mpc's
   ratio on the same data;
3. compute: the achievable rate, the per-layer-per-micro-batch and the per-step framework
   overheads, fitted (least squares, all >= 0) so that the model, holding 1. and 2.,
   reproduces the measured median step times of calibration runs (run dirs with
   summary.json); three runs that differ in FLOPs, layers x micro-batches and steps fix them.

Benchmarks and codec timings are divided by the stretch their threads saw (time runnable /
time on a core, perfmodel.stretch), and the runs are fitted with the other jobs' threads
measured during them, so the profile holds values for a core of one's own.

Output: <results>/calibration/local.json: {"profile": {...}, "measured": {...}}; the local
cluster profile names that file, so local predictions use it.

    python -m neoxlab.commands.calibrate --insitu experiment=<name> [overrides]

measures an experiment's in-situ profile instead (neoxlab.tune.insitu: on the emulated
cluster, omb sweeps inside it at the experiment's uplink rate and placement, and every codec
of tune.codecs timed here), cached under <results>/calibration/insitu/ for task=predict and
task=tune.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from neoxlab.compress.registry import calibration_specs
from neoxlab.config import Config, ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import PerfProfile
from neoxlab.files import REPO_ROOT, now
from neoxlab.launch.local import mpiexec_path
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel.codec_timing import measure_codec
from neoxlab.perfmodel.fit import fit_alpha_beta, nonnegative_lstsq
from neoxlab.perfmodel.predict import predict_with
from neoxlab.perfmodel.stretch import Sampler, during_steps
from neoxlab.run import rundir
from neoxlab.tune import insitu
from neoxlab.tune.candidates import tune_codecs

# The calibration runs (neox_small, data parallel on 4 ranks, overrides of experiment
# local_3d): micro-batches of 1 and 4 sequences separate the FLOP rate from the per-layer
# cost, 2 micro-batches a step the per-layer-per-micro-batch cost from the per-step one.
# tests/integration/test_perfmodel.py validates on other layouts.
CALIBRATION_RUNS = {
    "dp4_mb1": ["parallel.micro_batch=1", "parallel.grad_accum=1"],
    "dp4_mb4": ["parallel.micro_batch=4", "parallel.grad_accum=1"],
    "dp4_mb2_ga2": ["parallel.micro_batch=2", "parallel.grad_accum=2"],
}
CALIBRATION_SETTINGS = ["model=neox_small", "parallel.tp=1", "parallel.pp=1",
                        "cluster.ranks_per_node=4"]
RUN_SETTINGS = ["train.steps=14", "train.metrics_warmup_steps=3", "logger.wandb=disabled"]
OMB_SIZES = "4096:4194304"
# as ranks of a training run see MPI (mpi4py's thread level multiple, back-to-back calls), not
# OSU's defaults that neoxlab.omb follows (single; a barrier after every collective call):
# at single, 4 ranks on 2 cores make MPICH's large all-reduces far slower
OMB_ITERS = ("-i", "100", "-x", "10", "--thread-level", "multiple", "--timing", "loop")
DEFAULT_CALIBRATION = Path("calibration") / "local.json"


# (benchmark, ranks) sweeps per backend: all-reduce over 2 and 4 ranks fix a collective's
# step latency and the bandwidth; the ping-pong latency the point-to-point latency (gloo's
# send/recv path is far cheaper than a step of its all-reduce)
LINK_SWEEPS = (("allreduce", 2), ("allreduce", 4), ("latency", 2))


def omb_sweep(benchmark: str, backend: str, ranks: int, timeout: float = 300
              ) -> tuple[list[dict], float]:
    """One omb sweep under mpiexec: rank 0's JSON rows and the ranks' stretch meanwhile."""
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "neoxlab.omb", benchmark,
           "--backend", backend, "--buffer", "torch" if backend == "torch" else "numpy",
           "--format", "json", "-m", OMB_SIZES, *OMB_ITERS]
    with Sampler("neoxlab.omb") as sampler:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=REPO_ROOT)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    start = proc.stdout.index("{")
    return json.loads(proc.stdout[start:])["rows"], sampler.between() or 1.0


FIT_PARAMS = ("inv_rate", "layer_overhead_us", "step_overhead_us")


def _with(profile: PerfProfile, values: dict[str, float]) -> PerfProfile:
    """The profile with fitted parameters; inv_rate is 1 / achievable TFLOPS."""
    changes = {k: v for k, v in values.items() if k != "inv_rate"}
    if "inv_rate" in values:
        inv = values["inv_rate"]
        changes["achievable_tflops"] = 1.0 / inv if inv > 0 else 1e30
    return dataclasses.replace(profile, **changes)


def _branches(cfg: Config, profile: PerfProfile, external: float | None) -> tuple[float, float]:
    pred = predict_with(cfg, resolve_layout(cfg), profile, "calibration", external)
    return pred.critical_s, pred.throughput_s


def _step(cfg: Config, profile: PerfProfile, external: float | None = None) -> float:
    return max(_branches(cfg, profile, external))


def fit_compute(runs: list[tuple[Config, float, float | None]], profile: PerfProfile,
                params: tuple[str, ...] = FIT_PARAMS) -> PerfProfile:
    """Least squares for `params` (all >= 0) over (config, measured step s, external load)
    runs. A step is the larger of two branches (critical path, CPU work at a share of the
    cores), each linear in every parameter but for a pipeline's share of busy ranks on shared
    cores (predict.slowdowns): each run's row is its binding branch linearized at the current
    values (one prediction there and one per parameter one unit up), repeated until the
    values and the binding branches settle (at once where every branch is linear)."""
    values = {name: 0.0 for name in params}
    chosen: list[int] | None = None
    for _ in range(20):
        point = _with(profile, values)
        binds = [int(np.argmax(_branches(cfg, point, e))) for cfg, _, e in runs]
        rows, rhs = [], []
        for (cfg, measured, e), b in zip(runs, binds, strict=True):
            at = _branches(cfg, point, e)[b]
            slopes = [_branches(cfg, _with(profile, {**values, name: values[name] + 1.0}),
                                e)[b] - at for name in params]
            rows.append(slopes)
            rhs.append(measured - at + sum(k * values[n] for k, n in zip(slopes, params,
                                                                           strict=True)))
        x = nonnegative_lstsq(np.array(rows), np.array(rhs))
        fitted = dict(zip(params, (float(v) for v in x), strict=True))
        settled = binds == chosen and all(
            math.isclose(fitted[n], values[n], rel_tol=1e-9, abs_tol=1e-12) for n in params)
        values, chosen = fitted, binds
        if settled:
            break
    if "inv_rate" in values and values["inv_rate"] <= 0:
        raise ConfigError(
            "calibration runs do not determine the compute rate (their fitted share of compute "
            "is <= 0); include a compute-heavy run, e.g. neox_small data parallel"
        )
    return _with(profile, values)


def measured_step(run_dir: Path) -> float:
    summary = rundir.read_json(run_dir / "summary.json")
    value = summary.get("median_iteration_s")
    if not value:
        raise ConfigError(f"{run_dir}/summary.json has no median_iteration_s; use a completed "
                          "training run as a calibration run")
    return float(value)


def calibrate(base: PerfProfile, runs: list[tuple[Path, float | None]], links: bool = True
              ) -> dict:
    """Every measurement, then the fitted profile; returns the calibration document.

    runs: (completed run dir, the other jobs' threads measured during it, or None)."""
    measured: dict = {"host": rundir.provenance(0)["host"],
                      "created_at": now()}
    profile = dataclasses.replace(base, calibration=None)
    if links:
        measured["links"] = {"used": "gloo (torch.distributed on CPU ranks: local training)"}
        fitted = {}
        for name, backend in (("gloo", "torch"), ("mpi", "mpi")):
            sweeps = [(bench, n, *omb_sweep(bench, backend, n)) for bench, n in LINK_SWEEPS]
            fitted[name] = fit_alpha_beta(sweeps)
            measured["links"][name] = {
                "per_core": dataclasses.asdict(fitted[name]),
                "sweeps": [{"benchmark": b, "ranks": n, "stretch": k, "rows": rows}
                           for b, n, rows, k in sweeps]}
        profile = dataclasses.replace(profile, intra=fitted["gloo"], inter=fitted["gloo"])
    codecs, raw = {}, {}
    for name, spec in calibration_specs().items():
        codecs[name], raw[name] = measure_codec(spec)
    measured["codecs"] = raw
    profile = dataclasses.replace(profile, codecs=codecs)
    if runs:
        loaded = [(rundir.load_config(d), measured_step(d), k) for d, k in runs]
        profile = fit_compute(loaded, profile)
        measured["runs"] = [
            {"run_dir": str(d), "experiment": cfg.experiment, "external": k,
             "measured_step_s": t, "fitted_step_s": _step(cfg, profile, k)}
            for (d, _), (cfg, t, k) in zip(runs, loaded, strict=True)
        ]
    profile = dataclasses.replace(
        profile, source=f"calibrated on {measured['host']} at {measured['created_at']} by "
        "neoxlab.commands.calibrate (gloo alpha-beta from omb, codecs timed in-process, "
        "compute rate and overheads fitted to calibration runs; per core)")
    return {"profile": _plain(dataclasses.asdict(profile)), "measured": _plain(measured)}


def _plain(data):
    """numpy scalars -> Python floats, so the JSON and OmegaConf take them."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    if isinstance(data, np.generic):
        return data.item()
    return data


def measured_run(root: Path, overrides: list[str], timeout: float | None = None
                 ) -> tuple[Path, float | None]:
    """One local_3d run (RUN_SETTINGS + overrides, results under `root`) and the other jobs'
    threads measured during its steady steps: calibration fits and validation predicts runs
    measured alike."""
    cmd = [sys.executable, "-m", "neoxlab", "experiment=local_3d",
           f"launch.results_dir={root}", *RUN_SETTINGS, *overrides]
    with Sampler("neoxlab.engines.builtin") as sampler:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = sorted((root / "local_3d").iterdir())[-1]
    cfg = rundir.load_config(run_dir)
    records = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, during_steps(sampler, records, cfg.train.metrics_warmup_steps,
                                 cfg.cluster.cores_per_node)


def launch_calibration_runs(results: Path) -> list[tuple[Path, float | None]]:
    """Run CALIBRATION_RUNS one after another, each with the load sampled during its steps."""
    out = []
    for name, overrides in CALIBRATION_RUNS.items():
        out.append(measured_run(results / "calibration" / "runs" / name,
                                [*CALIBRATION_SETTINGS, *overrides]))
        print(f"calibration run {name}: {out[-1][0]}", flush=True)
    return out


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path, doc)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.commands.calibrate",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=Path, nargs="*", default=None,
                        help="completed local training run dirs to fit compute and overheads "
                             "(default: launch CALIBRATION_RUNS)")
    parser.add_argument("--no-runs", action="store_true",
                        help="links and codecs only; keep the profile's compute values")
    parser.add_argument("--cluster", default="local", help="cluster config to start from")
    parser.add_argument("--insitu", nargs=argparse.REMAINDER, metavar="experiment=NAME",
                        help="measure an experiment's in-situ profile (experiment=<name> "
                             "and its overrides follow)")
    args = parser.parse_args(argv)
    if args.insitu is not None:
        return measure_insitu(args.insitu)
    cfg = compose_experiment("local_3d", [f"cluster={args.cluster}",
                                          f"launch.results_dir={args.results}"])
    if cfg.cluster.profile is None:
        print(f"error: cluster {args.cluster} has no profile to calibrate", file=sys.stderr)
        return 2
    try:
        if args.no_runs:
            runs = []
        elif args.runs is not None:
            runs = [(d, None) for d in args.runs]
        else:
            runs = launch_calibration_runs(args.results)
        doc = calibrate(cfg.cluster.profile, runs)
    except (ConfigError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    path = write(doc, args.results / (cfg.cluster.profile.calibration or DEFAULT_CALIBRATION))
    print(json.dumps(doc["profile"], indent=2))
    print(f"calibration written to {path}")
    return 0


def measure_insitu(args: list[str]) -> int:
    """The in-situ profile of `experiment=<name> [overrides]`, measured and cached."""
    names = [a.split("=", 1)[1] for a in args if a.startswith("experiment=")]
    if len(names) != 1:
        print("error: --insitu needs experiment=<name> (then its overrides)", file=sys.stderr)
        return 2
    try:
        cfg = compose_experiment(names[0], [a for a in args if not a.startswith("experiment=")])
        found = insitu.resolve(cfg, measure=True, specs=tune_codecs(cfg), fresh=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"in-situ profile: {found.origin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
