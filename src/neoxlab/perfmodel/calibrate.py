"""Calibrate the local profile from measurements on this machine; write it as JSON.

    python -m neoxlab.perfmodel.calibrate [--results results] [--runs RUN_DIR ...]

1. links: alpha-beta of gloo (torch.distributed, what local training uses) and of MPI
   (mpi4py), each fitted to an OSU-style all-reduce sweep of neoxlab.omb under mpiexec:
   t(M) = 2(n-1) alpha + 2(n-1)/n M / B, least squares over the message sizes;
2. codecs: encode/decode throughput and per-call cost of zfp and mpc, timed in this process
   on one thread (the ranks' setting) at a small and a large message; mpc's ratio on the
   same data;
3. compute: the achievable rate, the per-layer-per-micro-batch and the per-step framework
   overheads, fitted (least squares, all >= 0) so that the model, holding 1. and 2.,
   reproduces the measured median step times of calibration runs (run dirs with
   summary.json); three runs that differ in FLOPs, layers x micro-batches and steps fix them.

Output: <results>/calibration/local.json: {"profile": {...}, "measured": {...}}; the local
cluster profile names that file, so local predictions use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from neoxlab import rundir
from neoxlab.config import Config, ConfigError
from neoxlab.perfmodel.predict import _predict
from neoxlab.perfmodel.profile import CodecProfile, LinkProfile, PerfProfile

OMB_SIZES = "1024:1048576"
OMB_ITERS = ("-i", "30", "-x", "5")
CODEC_SPECS = {"zfp": "zfp:rate=8", "mpc": "mpc"}
DEFAULT_CALIBRATION = Path("calibration") / "local.json"


def fit_alpha_beta(rows: list[dict], n: int) -> LinkProfile:
    """Ring all-reduce model through (size, avg_us) rows of an omb all-reduce sweep."""
    sizes = np.array([r["size"] for r in rows], dtype=float)
    secs = np.array([r["avg_us"] for r in rows], dtype=float) * 1e-6
    slope, intercept = np.polyfit(sizes, secs, 1)
    latency = max(intercept, 0.0) / (2 * (n - 1))
    slope = max(slope, 1e-15)
    bandwidth = 2 * (n - 1) / n / slope / 1e9
    return LinkProfile(latency_us=latency * 1e6, bandwidth_gbs=bandwidth)


def omb_allreduce(backend: str, ranks: int, timeout: float = 300) -> list[dict]:
    """One omb all-reduce sweep under mpiexec; the JSON rows of rank 0."""
    from neoxlab.launch.local import mpiexec_path

    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "neoxlab.omb", "allreduce",
           "--backend", backend, "--buffer", "torch" if backend == "torch" else "numpy",
           "--format", "json", "-m", OMB_SIZES, *OMB_ITERS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=rundir.REPO_ROOT)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    start = proc.stdout.index("{")
    return json.loads(proc.stdout[start:])["rows"]


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_codec(spec: str, small: int = 4096, large: int = 1 << 20, repeats: int = 7
                  ) -> tuple[CodecProfile, dict]:
    """Throughput from the large message, per-call cost from the small one (fp32 values)."""
    import torch

    from neoxlab.compress import make_compressor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        codec = make_compressor(spec)
        gen = torch.Generator().manual_seed(0)
        points = {}
        for nbytes in (small, large):
            x = torch.randn(nbytes // 4, generator=gen) * 1e-3  # gradient-like values
            buf = codec.encode(x)
            points[nbytes] = (
                _median_time(lambda c=codec, x=x: c.encode(x), repeats),
                _median_time(lambda c=codec, b=buf: c.decode(b), repeats),
                x.nbytes / buf.numel(),
            )
    finally:
        torch.set_num_threads(threads)
    (enc_s, dec_s, _), (enc_l, dec_l, ratio) = points[small], points[large]
    span = large - small
    enc_gbs = span / max(enc_l - enc_s, 1e-9) / 1e9
    dec_gbs = span / max(dec_l - dec_s, 1e-9) / 1e9
    call = max(0.0, (enc_s - small / (enc_gbs * 1e9) + dec_s - small / (dec_gbs * 1e9)) / 2)
    lossless = make_compressor(spec).lossless
    profile = CodecProfile(encode_gbs=enc_gbs, decode_gbs=dec_gbs, call_us=call * 1e6,
                           ratio=round(ratio, 4) if lossless else None)
    raw = {"spec": spec, "sizes": [small, large],
           "encode_s": [enc_s, enc_l], "decode_s": [dec_s, dec_l], "ratio_large": ratio}
    return profile, raw


FIT_PARAMS = ("inv_rate", "layer_overhead_us", "step_overhead_us")


def _with(profile: PerfProfile, values: dict[str, float]) -> PerfProfile:
    """The profile with fitted parameters; inv_rate is 1 / achievable TFLOPS."""
    changes = {k: v for k, v in values.items() if k != "inv_rate"}
    if "inv_rate" in values:
        inv = values["inv_rate"]
        changes["achievable_tflops"] = 1.0 / inv if inv > 0 else 1e30
    return dataclasses.replace(profile, **changes)


def _step(cfg: Config, profile: PerfProfile) -> float:
    from neoxlab.layout import resolve_layout

    return _predict(cfg, resolve_layout(cfg), profile, "calibration").step_s


def fit_compute(runs: list[tuple[Config, float]], profile: PerfProfile,
                params: tuple[str, ...] = FIT_PARAMS) -> PerfProfile:
    """Least squares for `params` (all >= 0). The step time is linear in each of them, so
    one prediction with all at 0 and one per parameter at 1 give a run's row."""
    zero = {name: 0.0 for name in params}
    rows, rhs = [], []
    for cfg, measured in runs:
        base = _step(cfg, _with(profile, zero))
        rows.append([_step(cfg, _with(profile, {**zero, name: 1.0})) - base for name in params])
        rhs.append(measured - base)
    x = _nonnegative_lstsq(np.array(rows), np.array(rhs))
    fitted = dict(zip(params, (float(v) for v in x), strict=True))
    if "inv_rate" in fitted and fitted["inv_rate"] <= 0:
        raise ConfigError(
            "calibration runs do not determine the compute rate (their fitted share of compute "
            "is <= 0); include a compute-heavy run, e.g. neox_small data parallel"
        )
    return _with(profile, fitted)


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: the best unconstrained fit over every subset of free
    parameters (the others at 0) whose solution is non-negative (a few parameters only)."""
    n = a.shape[1]
    best_err, best = np.inf, np.zeros(n)
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        sub = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (sub < 0).any():
            continue
        x = np.zeros(n)
        x[cols] = sub
        err = float(np.sum((a @ x - b) ** 2))
        if err < best_err - 1e-15:
            best_err, best = err, x
    return best


def measured_step(run_dir: Path) -> float:
    summary = rundir.read_json(run_dir / "summary.json")
    value = summary.get("median_iteration_s")
    if not value:
        raise ConfigError(f"{run_dir}/summary.json has no median_iteration_s; use a completed "
                          "training run as a calibration run")
    return float(value)


def calibrate(base: PerfProfile, run_dirs: list[Path], links: bool = True,
              omb_ranks: int = 4) -> dict:
    """Every measurement, then the fitted profile; returns the calibration document."""
    measured: dict = {"host": rundir.provenance(0)["host"],
                      "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    profile = dataclasses.replace(base, calibration=None)
    if links:
        gloo_rows = omb_allreduce("torch", omb_ranks)
        mpi_rows = omb_allreduce("mpi", 2)
        gloo, mpi = fit_alpha_beta(gloo_rows, omb_ranks), fit_alpha_beta(mpi_rows, 2)
        measured["links"] = {
            "gloo": {"ranks": omb_ranks, "fit": dataclasses.asdict(gloo), "rows": gloo_rows},
            "mpi": {"ranks": 2, "fit": dataclasses.asdict(mpi), "rows": mpi_rows},
            "used": "gloo (torch.distributed on CPU ranks, what local training runs)",
        }
        profile = dataclasses.replace(profile, intra=gloo, inter=gloo)
    codecs, raw = {}, {}
    for name, spec in CODEC_SPECS.items():
        codecs[name], raw[name] = measure_codec(spec)
    measured["codecs"] = raw
    profile = dataclasses.replace(profile, codecs=codecs)
    if run_dirs:
        runs = [(rundir.load_config(d), measured_step(d)) for d in run_dirs]
        profile = fit_compute(runs, profile)
        measured["runs"] = [
            {"run_dir": str(d), "experiment": cfg.experiment, "measured_step_s": t,
             "fitted_step_s": _step(cfg, profile)}
            for d, (cfg, t) in zip(run_dirs, runs, strict=True)
        ]
    profile = dataclasses.replace(
        profile, source=f"calibrated on {measured['host']} at {measured['created_at']} by "
        "neoxlab.perfmodel.calibrate (gloo alpha-beta from omb, codecs timed in-process, "
        "compute rate and layer overhead fitted to calibration runs)")
    return {"profile": dataclasses.asdict(profile), "measured": measured}


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path, doc)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.perfmodel.calibrate",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=Path, nargs="*", default=[],
                        help="completed local training run dirs to fit compute and overhead")
    parser.add_argument("--cluster", default="local", help="cluster config to start from")
    args = parser.parse_args(argv)
    from neoxlab.compose import compose_experiment

    cfg = compose_experiment("local_3d", [f"cluster={args.cluster}",
                                          f"launch.results_dir={args.results}"])
    if cfg.cluster.profile is None:
        print(f"error: cluster {args.cluster} has no profile to calibrate", file=sys.stderr)
        return 2
    try:
        doc = calibrate(cfg.cluster.profile, args.runs)
    except (ConfigError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    path = write(doc, args.results / (cfg.cluster.profile.calibration or DEFAULT_CALIBRATION))
    print(json.dumps(doc["profile"], indent=2))
    print(f"calibration written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
