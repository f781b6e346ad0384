"""The four schemes on emulated nodes, side by side at each inter-node rate: samples/s and
TFLOPS/GPU per scheme, gain over baseline, the measured communication share of a step and
what the uplinks carried; every point is the median run of --repeats runs (default 1) of
experiment emulated_sweep, the spread of samples/s over them kept beside it.

Needs root + iproute2; run it alone (it is heavy, about 15 minutes with the defaults):
    .venv/bin/python studies/emulated_sweep.py --rates none 1000 200 40 10
    .venv/bin/python studies/emulated_sweep.py --repeats 3 --rates none 300 200 80 40
    .venv/bin/python studies/emulated_sweep.py --layout 4x1 --rates none 40
    .venv/bin/python studies/emulated_sweep.py --layout 4x1-owner --rates 200 40
    .venv/bin/python studies/emulated_sweep.py --tuned --repeats 3 --rates 40 200  # + the pick
    .venv/bin/python studies/emulated_sweep.py --checks     # the pick's goals, from the table
    .venv/bin/python studies/emulated_sweep.py --tuned --rates 40 200 \\
        --data docs/measurements/data/<date>-emulated-sweep.runs.jsonl   # + every run's row
    .venv/bin/python studies/emulated_sweep.py --from-data docs/measurements/data/<...>.jsonl
    .venv/bin/python studies/emulated_sweep.py --from-data <file> <file> --developed-on 2x2:200
Appends to results/tables/emulated_sweep.sweep.csv (a row per layout, rate and scheme; a
point measured again replaces its row), then `make figures EXP=emulated_sweep` draws it.
--data: every run's row (results/rundata.py: every step's time and loss, bytes per dimension,
with what the table takes from the run: its measures, the load beside it, the pick's
prediction) appended as it finishes; --from-data rebuilds the table's rows and the checks
from such a file alone, after the run dirs are gone.

The fixed schemes are sweep_runs.SCHEMES: the paper's four and int8, int4, fp16, bf16, fp8 on
every dimension; "best fixed" is the best of all of them.

--tuned: at each rate, task=tune first with its defaults, guard on (--predicted-only:
tune.measure=false; studies/sweep_points.py tune_point);
its pick runs as scheme "tuned", interleaved with the others, and the rows keep the tuner's
predicted step (and for the pick its predicted and carried uplink payload per step: the
median run's uplinks less those of one 3-step run of the pick, over the steps between). The
end prints the pick's goals per point (tuned_checks): at least 0.97x the best fixed scheme,
predicted within 15 %, uplink bytes within 5 %, and how often it beats naive by 10 % where
the baseline communicates 90 % of its step or more.

comm share: the accounted time of the training collectives (all-reduce, reduce(-scatter),
all-gather, all-to-all; start-up broadcasts left out) per rank over the run's summed step
times. `external`: other jobs' threads competing for the cores while the ranks ran their
steady steps (perfmodel.stretch), the input the performance model takes for a shared
machine; `external_whole_steps`: the same taken over whole steps (it counts the ranks' own
bursts as other jobs' threads), and `others_cores`: cores busy with anything but our
processes (/proc/stat), kept beside it as the check.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from sweep_points import run_point, tune_point
from sweep_runs import (
    LAYOUTS,
    SCHEMES,
    TABLE,
    TUNED,
    Pick,
    Run,
    median_run,
    naive_beaten,
    point_rows,
    prediction_errors,
    step_uplink_payload,
    tuned_checks,
    write,
)

from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
SHORT_STEPS = 3  # the short run of the pick: 2 warm-up steps + 1


def data_row(layout: str, rate: str, scheme: str, repeat: int, run: Run, pick: Pick | None,
             short: Run | None) -> dict:
    """A run's row for the --data file: the run's own (rundata), what the table takes from
    it, and for the pick the prediction and the uplink payload a step (against the short
    run, measured now: the run dirs may be gone when the table is rebuilt)."""
    row = rundata.run_row(run.run_dir, layout=layout, rate_mbit=rate, scheme=scheme,
                          repeat=repeat)
    row.update(metrics=run.metrics, load=run.load)
    if pick is not None:
        row["pick"] = {"config": pick.config, "tune_dir": str(pick.tune_dir),
                       "predicted_step_s": pick.predicted_step_s,
                       "uplink_payload_bytes": pick.uplink_payload_bytes}
        if scheme == TUNED and short is not None:
            row["uplink_payload_bytes_per_step"] = step_uplink_payload(run.run_dir,
                                                                       short.run_dir)
    return row


def rows_from_data(path: Path) -> list[dict]:
    """The table's rows rebuilt from a --data file: per point the median run of each scheme,
    as point_rows makes them from the runs."""
    data = rundata.read(path)
    out = []
    for layout, rate in dict.fromkeys((r["layout"], r["rate_mbit"]) for r in data):
        mine = [r for r in data if (r["layout"], r["rate_mbit"]) == (layout, rate)]
        schemes = list(dict.fromkeys(r["scheme"] for r in mine))
        if "none" in schemes:  # the baseline first: the gains are over it
            schemes.remove("none")
            schemes.insert(0, "none")
        runs = {(rate, s): [Run(Path(r["run_dir"]), r["metrics"], r["load"]) for r in mine
                            if r["scheme"] == s] for s in schemes}
        picked = next((r["pick"] for r in mine if "pick" in r), None)
        pick = None if picked is None else Pick(picked["config"], Path(picked["tune_dir"]),
                                                picked["predicted_step_s"],
                                                picked["uplink_payload_bytes"])
        rows = point_rows(layout, rate, schemes, runs, pick, None)
        for row in rows:  # the pick's carried payload, as measured when it ran
            if row["scheme"] == TUNED:
                mid = median_run(runs[rate, TUNED])
                (r,) = [r for r in mine if r["run_dir"] == str(mid.run_dir)]
                row["uplink_payload_bytes_per_step"] = r.get("uplink_payload_bytes_per_step")
                row["predicted_uplink_payload_bytes_per_step"] = pick.uplink_payload_bytes
        out += rows
    return out


def print_rows(rows: list[dict]) -> None:
    print("| layout | Mbit/s | scheme | samples/s (min-max, runs) | gain | comm | codec | "
          "uplinks MB/step | final loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['rate_mbit']} | {r['scheme']} | {r['samples_per_s']:.3f} "
              f"({r['samples_per_s_min']:.3f}-{r['samples_per_s_max']:.3f}, {r['runs']}) | "
              f"{r['gain_samples']:+.1%} | {r['comm_share']:.0%} | {r['codec_share']:.0%} | "
              f"{r['uplink_MB_per_step']:.2f} | {r['final_loss']:.4f} |")


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def print_prediction_errors(rows: list[dict]) -> None:
    """The tuner's predicted step against the measured one for every scheme of a tuned
    point, and the spread of the errors (median and largest magnitude)."""
    errors = prediction_errors(rows)
    if not errors:
        return
    print("| layout | Mbit/s | scheme | predicted step s | measured step s | error |")
    print("|---|---|---|---|---|---|")
    for e in errors:
        print(f"| {e['layout']} | {e['rate_mbit']} | {e['scheme']} | {e['predicted_step_s']:.3f}"
              f" | {e['step_s']:.3f} | {e['error']:+.1%} |")
    sizes = sorted(abs(e["error"]) for e in errors)
    print(f"prediction errors: {len(sizes)} rows, median |error| "
          f"{statistics.median(sizes):.1%}, largest {sizes[-1]:.1%}, within 15 %: "
          f"{sum(s <= 0.15 for s in sizes)}")


def print_held_out(rows: list[dict], developed_on: set[str]) -> None:
    """The prediction errors of the points the model was developed on (`layout:rate`) apart
    from the others: a model judged on its own development points says little."""
    groups: dict[str, list[float]] = {}
    for e in prediction_errors(rows):
        seen = f"{e['layout']}:{e['rate_mbit']}" in developed_on
        groups.setdefault("developed on" if seen else "held out", []).append(e["error"])
    print("| points | rows | median abs error | largest | within 15 % | mean signed |")
    print("|---|---|---|---|---|---|")
    for name, errors in groups.items():
        sizes = sorted(abs(x) for x in errors)
        print(f"| {name} | {len(sizes)} | {statistics.median(sizes):.1%} | {sizes[-1]:.1%} | "
              f"{sum(x <= 0.15 for x in sizes)} | {statistics.mean(errors):+.1%} |")


def print_checks(table: Path | list[dict]) -> None:
    if isinstance(table, list):
        checks = tuned_checks(table)
    else:
        with table.open() as f:
            checks = tuned_checks(list(csv.DictReader(f)))
    for c in checks:
        print(f"{c['layout']} {c['rate_mbit']:>5}: tuned {c['tuned_samples_per_s']:.3f} samples/s"
              f", {c['vs_best_fixed']:.3f}x best fixed ({c['best_fixed']})"
              f"{'' if c['ok_throughput'] else ' BELOW 0.97'}, "
              f"{_times(c['vs_best_within_naive_loss'])} best fixed no further from none's "
              f"loss than naive ({c['best_within_naive_loss']}), {_times(c['vs_int8'])} int8, "
              f"{c['vs_naive']:.3f}x naive, "
              f"baseline comm {c['baseline_comm_share']:.0%}, "
              f"predicted {c['prediction_error']:+.1%}"
              f"{'' if c['ok_prediction'] else ' (OUTSIDE 15 %)'}, uplink bytes "
              f"{c['bytes_error']:+.1%}{'' if c['ok_bytes'] else ' (OUTSIDE 5 %)'}")
    beaten, heavy = naive_beaten(checks)
    print(f"points: {len(checks)}; at 0.97x best fixed or more: "
          f"{sum(c['ok_throughput'] for c in checks)}; predicted within 15 %: "
          f"{sum(c['ok_prediction'] for c in checks)}; bytes within 5 %: "
          f"{sum(c['ok_bytes'] for c in checks)}; beats naive by 10 %: {beaten} of the {heavy} "
          "points whose baseline communicates >= 90 % (goal: a third)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["none", "1000", "200", "40", "10"],
                        help="inter-node Mbit/s per node and direction; none: unshaped")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="2x2")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--tuned", action="store_true",
                        help="tune each rate first; its pick runs beside the schemes")
    parser.add_argument("--checks", action="store_true",
                        help="no runs: print the pick's goals from the table")
    parser.add_argument("--steps", type=int, default=5, help="2 warm-up steps + the median's")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per point, interleaved (every rate and scheme once, then "
                        "again); a point is its median run")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--predicted-only", action="store_true",
                        help="tune with tune.measure=false (no capture, no probes); the "
                             "default tunes as a user does, guard on")
    parser.add_argument("--data", type=Path, default=None,
                        help="append every run's row to this data file")
    parser.add_argument("--from-data", type=Path, nargs="+", default=None,
                        help="no runs: the table and the checks of data files")
    parser.add_argument("--developed-on", nargs="+", default=None, metavar="LAYOUT:RATE",
                        help="with --from-data: the points the model was developed on; the "
                             "prediction errors are summed up apart for them and the rest")
    args = parser.parse_args()
    args.results = args.results.resolve()
    if args.from_data:
        rows = [r for path in args.from_data for r in rows_from_data(path)]
        print_rows(rows)
        print_prediction_errors(rows)
        if args.developed_on:
            print_held_out(rows, set(args.developed_on))
        if any(r["scheme"] == TUNED for r in rows):
            print_checks(rows)
        return 0
    if args.checks:
        print_checks(args.results / TABLE)
        return 0
    if args.tuned and args.steps <= SHORT_STEPS:
        parser.error(f"--tuned measures the pick's bytes a step against a {SHORT_STEPS}-step "
                     f"run: --steps must be more than {SHORT_STEPS} (got {args.steps})")
    schemes = [*args.schemes, TUNED] if args.tuned else args.schemes
    picks: dict[str, Pick] = {}
    shorts: dict[str, Run] = {}
    runs: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for repeat in range(1, args.repeats + 1):
        for rate in args.rates:
            if args.tuned and rate not in picks:
                picks[rate] = tune_point(rate, args.layout, model=args.model,
                                         results=args.results, measure=not args.predicted_only)
                # for the pick's bytes a step: start-up traffic cancels against this run
                shorts[rate] = run_point(picks[rate].config, rate, args.layout,
                                         model=args.model, steps=SHORT_STEPS,
                                         results=args.results)
                print(f"{args.layout} {rate:>5} tuned: {picks[rate].config} "
                      f"({picks[rate].tune_dir}; short run {shorts[rate].run_dir})", flush=True)
            for scheme in schemes:
                config = picks[rate].config if scheme == TUNED else scheme
                run = run_point(config, rate, args.layout, model=args.model,
                                steps=args.steps, results=args.results)
                runs[rate, scheme].append(run)
                if args.data:
                    rundata.append(args.data, [data_row(args.layout, rate, scheme, repeat, run,
                                                        picks.get(rate), shorts.get(rate))])
                m, load = run.metrics, run.load
                print(f"{args.layout} {rate:>5} {scheme:<9} run {repeat}/{args.repeats} "
                      f"{m['samples_per_s']:7.3f} samples/s  comm {m['comm_share']:4.0%}  "
                      f"codec {m['codec_share']:4.0%}  uplinks {m['uplink_MB_per_step']:6.2f} "
                      f"MB/step  external {load['external'] or 0:.1f} (whole steps "
                      f"{load['external_whole_steps'] or 0:.1f}, others' CPU "
                      f"{load['others_cores'] or 0:.2f} cores)  loss {m['final_loss']:.4f}",
                      flush=True)
            rows = point_rows(args.layout, rate, schemes, runs, picks.get(rate),
                              shorts.get(rate))
            write(rows, args.results / TABLE)
            print("  ".join(f"{r['scheme']} {r['gain_samples']:+.1%}" for r in rows[1:])
                  + f"  (gains of the median runs, {len(runs[rate, schemes[0]])} per "
                  "point)", flush=True)
    print(f"table: {args.results / TABLE}")
    if args.tuned:
        print_checks(args.results / TABLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
