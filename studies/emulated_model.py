"""The performance model against the emulated bandwidth sweep (studies/emulated_sweep.py):
the uplink's alpha-beta fitted from gloo all-reduce and all-gather sweeps inside the emulated
cluster at some rates (experiment emulated_omb; one flow per uplink, and 2 groups at once for
the 2 flows of a node's 2 ranks) and the codecs timed on one thread, scaled to the codec time
the compressed sweep runs at the fit rates spent (perfmodel.emulated.codec_scale), then every
sweep point predicted; points at rates the omb fits did not use are held out and take no part
in any fit. No run's throughput is fitted: compute and overheads come from the local profile
(neoxlab.perfmodel.emulated).

    .venv/bin/python studies/emulated_model.py --measure   # omb runs and codec timings, ~13 min
    .venv/bin/python studies/emulated_model.py             # reuse both
    .venv/bin/python studies/emulated_model.py --data docs/measurements/data/<date>-model.jsonl
    .venv/bin/python studies/emulated_model.py --from-data docs/measurements/data/<...>.jsonl

Writes results/tables/emulated_sweep.{model,curves,crossover}.csv and
results/calibration/emulated.json, prints the errors, the crossovers and the Lassen line.
--data writes the model's inputs to a data file (results/rundata.py rows): every omb run's
rows it fitted (rate, flows, nodes; size, time), every sweep row it predicted (with the
codec seconds a step of the compressed runs at the fit rates), the local profile and the
one-thread codec timings; --from-data fits and predicts again from that file alone (no
emulated cluster, no run dirs) and prints the same tables.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from sweep_runs import LAYOUTS, TABLE, codec_s, rows_of, step_collectives

from neoxlab.compress.registry import calibration_specs
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, PerfProfile
from neoxlab.perfmodel import emulated as em
from neoxlab.perfmodel.codec_timing import measure_codec
from neoxlab.perfmodel.predict import predict
from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]

FIT_RATES = ["none", "200", "10"]  # omb fits; the sweep's other rates are held out
FIT_FLOWS = [1, 2]  # flows through an uplink at once (2: the 2x2 layout's 2 ranks per node)
FIT_NODES = [2, 4]  # nodes sending at once (4: the 4x1 layouts), one flow each
FIT_RUNS = 5  # one run's bare-link fit moves by +-15 % (4 nodes: 18.5-25.3 MB/s in one day)
CURVE_RATES = np.geomspace(5, 5000, 40)
SHARE_BOUND = 0.40  # the error summary covers points where communication is >= 40 % of the step
CALIBRATION = Path("calibration") / "emulated.json"  # under --results
LASSEN = ["baseline_192gpu", "naive_192gpu", "hybrid_192gpu", "mzhybrid_192gpu"]


def omb_runs(results: Path, rates: list[str], flows: list[int], nodes: list[int],
             measure: bool, newest: int) -> dict[em.FitKey, list[Path]]:
    """The `newest` emulated_omb runs at each rate, flow count and node count (--measure adds
    one at each first): every rate and flow count on 2 nodes, every rate also on more nodes
    with one flow each."""
    points = [(r, f, 2) for r in rates for f in flows]
    points += [(r, 1, n) for r in rates for n in nodes if n != 2]
    if measure:
        for point in points:
            em.run_omb(point, results)
    root = results / "emulated_omb"
    found = em.find_omb_runs(root)
    missing = [p for p in points if p not in found]
    if missing:
        raise SystemExit(f"no emulated_omb run at (rate, flows, nodes) {missing} under {root}: "
                         "use --measure")
    return {p: found[p][-newest:] for p in points}


def model_codecs(results: Path, local: dict[str, CodecProfile], measure: bool
                 ) -> dict[str, CodecProfile]:
    """The codecs timed on one thread with --measure (or when no earlier run left them in
    results/calibration/emulated.json), else those earlier timings: rerunning the model on
    the same measurements gives the same predictions (codec timings move by up to 30 %
    between runs)."""
    codecs = dict(local)
    calibration = results / CALIBRATION
    if not measure and calibration.exists():
        saved = json.loads(calibration.read_text()).get("codecs", {})
        if set(calibration_specs()) <= set(saved):
            return codecs | {k: CodecProfile(**saved[k]) for k in calibration_specs()}
    return codecs | {name: measure_codec(spec)[0] for name, spec in calibration_specs().items()}


def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@functools.cache
def lassen_predictions() -> dict:
    """The Lassen experiments as the model predicts them (configs only: no measured input)."""
    return {name: predict(compose_experiment(name, [])) for name in LASSEN}


def inter_share(pred) -> float:
    """The predicted share of the step spent on inter-node links."""
    wire = sum(pred.breakdown[d] for d in ("tp", "pp", "dp", "zero")
               if pred.links[d] == "inter")
    return wire / pred.step_s


def predict_rows(measured: list[dict], base, links: em.UplinkModel,
                 codecs: dict[str, CodecProfile], args) -> list[dict]:
    """Every sweep point predicted, beside what it measured."""
    rows = []
    for row in measured:
        pred = em.predict_point(point_config(row, args.model), base, links, codecs,
                                _external(row))
        m = float(row["samples_per_s"])
        rows.append({
            "layout": row["layout"], "rate_mbit": row["rate_mbit"], "scheme": row["scheme"],
            "measured_samples_per_s": m, "predicted_samples_per_s": pred.samples_per_s,
            "error": pred.samples_per_s / m - 1, "measured_comm_share": row["comm_share"],
            "predicted_comm_share": inter_share(pred),
            "held_out": row["rate_mbit"] not in args.fit_rates,
            "measured_gain": float(row["gain_samples"])})
    base_pred = {(r["layout"], r["rate_mbit"]): r["predicted_samples_per_s"]
                 for r in rows if r["scheme"] == "none"}
    for r in rows:
        b = base_pred.get((r["layout"], r["rate_mbit"]))
        r["predicted_gain"] = r["predicted_samples_per_s"] / b - 1 if b else math.nan
    return rows


def point_config(row: dict, model: str):
    return sweep_config(row["scheme"], row["rate_mbit"], row["layout"], model)


@functools.cache
def sweep_config(scheme: str, rate: str, layout: str, model: str):
    """A sweep point's config, composed once (the fits and every table ask for it again)."""
    return em.sweep_config(scheme, rate, LAYOUTS[layout], model)


def _external(row: dict) -> float | None:
    return float(row["external"]) if row["external"] else None


def codec_s_per_step(run_dir: Path) -> float:
    """A rank's codec seconds per step in a sweep run (the training collectives')."""
    steps = len(rows_of(run_dir / "metrics.jsonl"))
    return codec_s(*step_collectives(run_dir)) / steps


def fitted_codec_runs(measured: list[dict], fit_rates: list[str]) -> list[dict]:
    """The sweep rows the codec scale is fitted on: the compressed runs at the fit rates."""
    return [r for r in measured if r["rate_mbit"] in fit_rates and r["scheme"] != "none"]


def fit_codec_scale(measured: list[dict], base, links: em.UplinkModel,
                    codecs: dict[str, CodecProfile], args) -> float:
    """The codec profile's time scaled to the compressed runs at the fit rates (no held-out
    point is used; their codec seconds a step in `codec_s_per_step`): twice, as the codec
    term is not quite linear in the codec time."""
    fit = fitted_codec_runs(measured, args.fit_rates)
    ran = [float(r["codec_s_per_step"]) for r in fit]
    scale = 1.0
    for _ in range(2):
        now = em.scaled_codecs(codecs, scale)
        predicted = [em.predict_point(point_config(r, args.model), base, links, now,
                                      _external(r)).codec_path_s for r in fit]
        scale *= em.codec_scale(ran, predicted)
    return scale


def held_out_summary(rows: list[dict]) -> str:
    held = [r for r in rows if r["held_out"] and float(r["measured_comm_share"]) >= SHARE_BOUND]
    if not held:
        return "no held-out point with communication >= 40 % of the step"
    errs = [abs(r["error"]) for r in held]
    return (f"held-out points with comm >= {SHARE_BOUND:.0%}: {len(held)}, |error| median "
            f"{statistics.median(errs):.1%}, max {max(errs):.1%}, within 15 %: "
            f"{sum(e <= 0.15 for e in errs)}/{len(errs)}")


OMB_FIELDS = ("benchmark", "size", "avg_us")  # what an omb fit reads of a row (read_omb's)


@dataclass
class Inputs:
    """Everything the model is fitted on and predicts, from the run dirs or a data file."""

    omb: dict[em.FitKey, list[list[dict]]]  # per fit point, each run's omb rows
    omb_dirs: dict[em.FitKey, list[str]]
    base: PerfProfile  # the local profile (its calibration applied)
    origin: str
    codecs: dict[str, CodecProfile]  # the local profile's and the one-thread timings
    measured: list[dict]  # the sweep's rows; the fit-rate compressed ones with codec_s_per_step


def live_inputs(results: Path, args) -> Inputs:
    runs = omb_runs(results, args.fit_rates, args.fit_flows, args.fit_nodes, args.measure,
                    args.fit_runs)
    base, origin = em.local_profile(results)
    measured = read_rows(results / TABLE)
    for r in fitted_codec_runs(measured, args.fit_rates):
        r["codec_s_per_step"] = codec_s_per_step(Path(r["run_dir"]))
    return Inputs({k: [[{f: r[f] for f in OMB_FIELDS} for r in em.read_omb(d)] for d in dirs]
                   for k, dirs in runs.items()},
                  {k: [str(d) for d in dirs] for k, dirs in runs.items()},
                  base, origin, model_codecs(results, base.codecs, args.measure), measured)


def data_rows(inputs: Inputs, calibration: Path, args) -> list[dict]:
    """The --data file's rows: one per omb run, one per sweep row, and the profiles."""
    omb = [{"kind": "omb", "run_dir": d, "rate_mbit": rate, "flows": flows, "nodes": nodes,
            "rows": rows}
           for (rate, flows, nodes), dirs in inputs.omb_dirs.items()
           for d, rows in zip(dirs, inputs.omb[rate, flows, nodes], strict=True)]
    sweep = [{"kind": "sweep", **r} for r in inputs.measured]
    profile = {"kind": "profiles", "run_dir": str(calibration), "origin": inputs.origin,
               "base_profile": dataclasses.asdict(inputs.base),
               "codecs": {k: dataclasses.asdict(v) for k, v in inputs.codecs.items()},
               "fit_rates": args.fit_rates, "model": args.model}
    return [*omb, *sweep, profile]


def data_inputs(path: Path) -> tuple[Inputs, dict]:
    """The model's inputs from a --data file alone; and its profiles row (fit rates, model)."""
    data = rundata.read(path)
    (prof,) = [r for r in data if r["kind"] == "profiles"]
    omb: dict[em.FitKey, list[list[dict]]] = {}
    dirs: dict[em.FitKey, list[str]] = {}
    for r in data:
        if r["kind"] == "omb":
            key = (r["rate_mbit"], int(r["flows"]), int(r["nodes"]))
            omb.setdefault(key, []).append(r["rows"])
            dirs.setdefault(key, []).append(r["run_dir"])
    base = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PerfProfile),
                                               prof["base_profile"]))
    measured = [{k: v for k, v in r.items() if k != "kind"} for r in data
                if r["kind"] == "sweep"]
    return Inputs(omb, dirs, base, prof["origin"],
                  {k: CodecProfile(**v) for k, v in prof["codecs"].items()}, measured), prof


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="run the omb fits first")
    parser.add_argument("--fit-rates", nargs="+", default=FIT_RATES)
    parser.add_argument("--fit-flows", nargs="+", type=int, default=FIT_FLOWS)
    parser.add_argument("--fit-nodes", nargs="+", type=int, default=FIT_NODES)
    parser.add_argument("--fit-runs", type=int, default=FIT_RUNS,
                        help="a fit is the median over this many newest omb runs of its point")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--one-thread-codecs", action="store_true",
                        help="the codecs as timed on one thread, not scaled to the fit-rate runs")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--data", type=Path, default=None,
                        help="write the model's inputs (omb rows, sweep rows, profiles) here")
    parser.add_argument("--from-data", type=Path, default=None,
                        help="no runs: fit and predict from a data file alone")
    args = parser.parse_args()
    results = args.results.resolve()
    if args.from_data is not None:
        inputs, prof = data_inputs(args.from_data)
        args.fit_rates, args.model = prof["fit_rates"], prof["model"]
        model(inputs, results, args, calibrate=False)
        return 0
    inputs = live_inputs(results, args)
    if args.data is not None:
        rundata.append(args.data, data_rows(inputs, results / CALIBRATION, args))
    model(inputs, results, args)
    return 0


def model(inputs: Inputs, results: Path, args, calibrate: bool = True,
          curve_rates=CURVE_RATES) -> list[dict]:
    """The fits, the predictions, the crossovers and the Lassen line: printed, and written
    under `results` (the calibration document only with `calibrate`); returns the model's
    rows."""
    fits = {key: em.median_fit([em.fit_rate(rows, key[2]) for rows in runs])
            for key, runs in inputs.omb.items()}
    links = em.UplinkModel.from_fits(fits)
    base, origin, codecs = inputs.base, inputs.origin, inputs.codecs
    doc = {"links": links.as_dict(),
           "codecs": {k: dataclasses.asdict(v) for k, v in codecs.items()},
           "base_profile": origin,
           "omb_runs": {f"{r} Mbit/s, {f} flow(s), {n} nodes": dirs
                        for (r, f, n), dirs in inputs.omb_dirs.items()}}
    out = results / CALIBRATION
    for (rate, flows, nodes), f in fits.items():
        print(f"omb fit {rate:>5} Mbit/s, {flows} flow(s), {nodes} nodes: alpha "
              f"{f.latency_us:8.1f} us  B {f.bandwidth_gbs * 1e3:9.2f} MB/s per flow  (median "
              f"of {len(inputs.omb[rate, flows, nodes])} runs)")
    eff = ", ".join(f"{n} nodes x {f} flow(s) {e:.3f}"
                    for (f, n), e in links.efficiency.items())
    bare = ", ".join(f"{n} nodes x {f} flow(s) {b * 1e3:.1f}"
                     for (f, n), b in links.unshaped_total.items())
    print(f"uplink model: efficiency of R/8 with {eff}; soft minimum with the bare link, "
          f"p = {links.sharpness:g}; alpha {links.latency_us:.0f} us; unshaped MB/s an uplink "
          f"carries with {bare}")

    measured = inputs.measured
    one_thread = predict_rows(measured, base, links, codecs, args)
    scale = 1.0
    if not args.one_thread_codecs:
        scale = fit_codec_scale(measured, base, links, codecs, args)
        doc["codec_scale"] = scale
    if calibrate:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
    codecs = em.scaled_codecs(codecs, scale)
    model_rows = predict_rows(measured, base, links, codecs, args) if scale != 1.0 \
        else one_thread
    tables = results / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    write_csv(model_rows, tables / "emulated_sweep.model.csv")
    print(f"\n{'layout':<6}{'rate':>6} {'scheme':<9}{'meas':>8}{'pred':>8}{'err':>8}"
          f"{'gain m':>8}{'gain p':>8}{'comm m':>8}{'comm p':>8}  held-out")
    for r in model_rows:
        print(f"{r['layout']:<6}{r['rate_mbit']:>6} {r['scheme']:<9}"
              f"{r['measured_samples_per_s']:8.3f}{r['predicted_samples_per_s']:8.3f}"
              f"{r['error']:+8.1%}{r['measured_gain']:+8.1%}{r['predicted_gain']:+8.1%}"
              f"{float(r['measured_comm_share']):8.0%}{r['predicted_comm_share']:8.0%}"
              f"  {'yes' if r['held_out'] else 'fit'}")
    if scale != 1.0:
        print(f"codecs {scale:.2f}x the one-thread profile's time (fit to the compressed runs "
              f"at the fit rates {', '.join(args.fit_rates)})")
        print("with the codecs as timed on one thread: " + held_out_summary(one_thread))
    print("model: " + held_out_summary(model_rows))
    curves, crossings = [], []
    for layout in sorted({r["layout"] for r in measured}):
        here = [r for r in measured if r["layout"] == layout]
        ext = statistics.median(float(r["external"]) for r in here if r["external"]) \
            if any(r["external"] for r in here) else None
        schemes = list(dict.fromkeys(r["scheme"] for r in here))
        cluster = point_config(here[0], args.model).cluster
        bare_rate = links.bare_rate_mbit(cluster.ranks_per_node, cluster.nodes)
        for rate in curve_rates:
            preds = {s: em.predict_point(sweep_config(s, f"{rate:g}", layout, args.model),
                                         base, links, codecs, ext)
                     for s in schemes}
            b = preds["none"]
            for s, p in preds.items():
                curves.append({"layout": layout, "rate_mbit": rate, "scheme": s,
                               "samples_per_s": p.samples_per_s,
                               "tflops_per_gpu": p.tflops_per_gpu,
                               "gain": p.samples_per_s / b.samples_per_s - 1,
                               "baseline_comm_share": inter_share(b), "external": ext})
        for s in schemes:
            if s == "none":
                continue
            pc = [c for c in curves if c["layout"] == layout and c["scheme"] == s]
            meas = em.crossover(*em.rated_gains([r for r in here if r["scheme"] == s],
                                                bare_rate))
            pred = em.crossover([c["rate_mbit"] for c in pc], [c["gain"] for c in pc])
            ratio = pred / meas if meas and pred else math.nan
            crossings.append({"layout": layout, "scheme": s, "measured_mbit": meas,
                              "predicted_mbit": pred, "ratio": ratio,
                              "bare_link_mbit": bare_rate})
            print(f"crossover {layout} {s:<9} measured "
                  f"{'-' if meas is None else f'{meas:.0f}'} Mbit/s, predicted "
                  f"{'-' if pred is None else f'{pred:.0f}'} Mbit/s (x{ratio:.2f}; the bare "
                  f"link at {bare_rate:.0f})")
    write_csv(curves, tables / "emulated_sweep.curves.csv")
    if crossings:
        write_csv(crossings, tables / "emulated_sweep.crossover.csv")

    lassen = lassen_predictions()
    b = lassen["baseline_192gpu"]
    comm = sum(b.breakdown[d] for d in ("tp", "pp", "dp", "zero")) / b.step_s
    gains = ", ".join(f"{p.scheme} {p.samples_per_s / b.samples_per_s - 1:+.1%}"
                      for n, p in lassen.items() if n != "baseline_192gpu")
    print(f"Lassen 192 GPUs (model): baseline comm share {comm:.1%}; gains {gains}")
    (tables / "emulated_sweep.lassen.json").write_text(json.dumps(
        {"baseline_comm_share": comm,
         "gains": {p.scheme: p.samples_per_s / b.samples_per_s - 1
                   for n, p in lassen.items() if n != "baseline_192gpu"}}, indent=2))
    return model_rows


if __name__ == "__main__":
    sys.exit(main())
