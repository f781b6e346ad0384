"""The tuner's regret on the emulated cluster: at each rate, task=tune (guard on;
`--predicted-only`: tune.measure=false) exports options of its predicted ranking and each
runs for real (experiment emulated_sweep's layout), interleaved over the options and rates,
repeat by repeat. Two modes:

- `--neighbours N` (the regret that matters): the pick and the N guard-passing options
  predicted next slower (tune.export_neighbours), `--repeats 3` runs of `--steps 8` each;
- `--count K`: K options spread evenly over the ranking, the baseline and the pick among
  them (tune.export_ranked), one run of 5 steps each: the ranking's shape.

Per option the median run (of samples/s); per rate the regret (the best measured option's
samples/s over the pick's; goal <= 1.05), the pick's measured rank and Kendall's tau between
the predicted and the measured step times (rank agreement; goal 0.8 or more).

Needs root + iproute2 and the in-situ profile of each rate (task=tune measures it when it
is missing); run it alone:
    .venv/bin/python studies/tune_regret.py --neighbours 3 --rates 200 120 \\
        --data docs/measurements/data/<date>-tune-regret-neighbours.runs.jsonl
    .venv/bin/python studies/tune_regret.py --count 12 --rates 200 40
    .venv/bin/python studies/tune_regret.py --from-data docs/measurements/data/<...>.jsonl

Runs are kept in results/tables/tune_regret[_neighbours].runs.jsonl, or the --data file; a
later call goes on where it stopped (the same tune's options, read back from its run dir, and
only the repeats missing). Each row holds the option (its predicted step and position in the
ranking), the repeat and its run's row (results/rundata.py: every step's time and loss, bytes
per dimension), so `--from-data` rebuilds the per-option table (printed as Markdown;
results/tables/tune_regret.options.csv) and the verdicts (results/tables/tune_regret.csv)
from the file alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path

from sweep_points import run_point, tune_point
from sweep_runs import LAYOUTS, rows_of

from neoxlab.files import REPO_ROOT
from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
TABLES = Path("tables")
RUNS = {"spread": TABLES / "tune_regret.runs.jsonl",
        "neighbours": TABLES / "tune_regret_neighbours.runs.jsonl"}
TABLE = TABLES / "tune_regret.csv"
OPTIONS_TABLE = TABLES / "tune_regret.options.csv"
DEFAULTS = {"spread": {"repeats": 1, "steps": 5}, "neighbours": {"repeats": 3, "steps": 8}}


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-a of two equally long sequences (pairs tied in either count as 0)."""
    def sign(v: float) -> int:
        return (v > 0) - (v < 0)

    n = len(xs)
    score = sum(sign(xs[i] - xs[j]) * sign(ys[i] - ys[j])
                for i in range(n) for j in range(i + 1, n))
    return score / (n * (n - 1) / 2)


def mode_of(row: dict) -> str:
    return row.get("mode", "spread")  # rows before the neighbour mode were spread ones


def point_of(row: dict) -> tuple[str, str, str]:
    return row["layout"], row["rate_mbit"], mode_of(row)


def options(layout: str, rate: str, mode: str, export: str, runs: list[dict],
            args) -> list[dict]:
    """The point's exported options, each copied to configs/compression under a name of its
    own (git-ignored: tuned_*), with its prediction. A point with runs already goes on with
    the tune those runs came from, so its options stay the same ones."""
    earlier = [r for r in runs if point_of(r) == (layout, rate, mode)]
    if earlier:
        tune_dir = Path(earlier[0]["tune_dir"])
        if not (tune_dir / "ranked.json").exists():
            raise SystemExit(f"{layout} at {rate} Mbit/s: its runs came from {tune_dir}, which "
                             "is gone; finish it with a new --data file")
    else:
        tune_dir = tune_point(rate, layout, model=args.model, results=args.results,
                              extra=(export,), measure=not args.predicted_only).tune_dir
    out = []
    for entry in json.loads((tune_dir / "ranked.json").read_text()):
        name = re.sub(r"[^A-Za-z0-9_]", "_", f"tuned_{mode}_{layout}_{rate}_{entry['name']}")
        text = (tune_dir / "ranked" / f"{entry['name']}.yaml").read_text()
        text = text.replace(f"scheme: {entry['name']}", f"scheme: {name}")
        (REPO_ROOT / "configs" / "compression" / f"{name}.yaml").write_text(text)
        out.append({**entry, "config": name, "layout": layout, "rate_mbit": rate,
                    "mode": mode, "tune_dir": str(tune_dir)})
    if mode == "neighbours" and len(out) < args.neighbours + 1:
        print(f"{layout} {rate:>5}: only {len(out) - 1} guard-passing options predicted "
              f"slower than the pick (asked {args.neighbours}); running those", flush=True)
    return out


def schedule(todo: dict[str, list[dict]], repeats: int,
             done: Counter) -> list[tuple[int, dict]]:
    """(repeat, option) in the order run: repeat by repeat, option by option, the rates
    interleaved within; an option's repeats already in `done` (counted by point_of and
    label) are left out."""
    order = []
    for repeat in range(1, repeats + 1):
        for i in range(max(map(len, todo.values()), default=0)):
            for rate_options in todo.values():
                if i < len(rate_options):
                    option = rate_options[i]
                    if done[(*point_of(option), option["label"])] < repeat:
                        order.append((repeat, option))
    return order


def option_table(runs: list[dict]) -> list[dict]:
    """Per option its median run (of samples/s; the lower middle of an even count), the
    spread of its runs and its measured rank at its point (1: the fastest)."""
    by_option: dict[tuple, list[dict]] = {}
    for r in runs:
        by_option.setdefault((*point_of(r), r["label"]), []).append(r)
    table = []
    for (layout, rate, mode, label), mine in by_option.items():
        mid = sorted(mine, key=lambda r: r["samples_per_s"])[(len(mine) - 1) // 2]
        speeds = [r["samples_per_s"] for r in mine]
        table.append({"layout": layout, "rate_mbit": rate, "mode": mode, "label": label,
                      "position": mid.get("position"), "chosen": bool(mid["chosen"]),
                      "predicted_step_s": mid["predicted_step_s"], "runs": len(mine),
                      "step_s": mid["step_s"], "samples_per_s": mid["samples_per_s"],
                      "samples_per_s_min": min(speeds), "samples_per_s_max": max(speeds)})
    for point in dict.fromkeys((o["layout"], o["rate_mbit"], o["mode"]) for o in table):
        mine = [o for o in table if (o["layout"], o["rate_mbit"], o["mode"]) == point]
        for rank, o in enumerate(sorted(mine, key=lambda o: -o["samples_per_s"]), 1):
            o["measured_rank"] = rank
    return sorted(table, key=lambda o: (o["layout"], o["rate_mbit"], o["mode"],
                                        o["predicted_step_s"]))


def verdicts(runs: list[dict]) -> list[dict]:
    """Per point (layout, rate, mode): the pick's regret and the model's ranking against the
    options' median runs."""
    table = option_table(runs)
    out = []
    for point in dict.fromkeys((o["layout"], o["rate_mbit"], o["mode"]) for o in table):
        mine = [o for o in table if (o["layout"], o["rate_mbit"], o["mode"]) == point]
        chosen = [o for o in mine if o["chosen"]]
        if len(mine) < 2 or not chosen:
            continue
        pick = chosen[0]
        best = max(mine, key=lambda o: o["samples_per_s"])
        out.append({"layout": point[0], "rate_mbit": point[1], "mode": point[2],
                    "options": len(mine), "runs_per_option": min(o["runs"] for o in mine),
                    "pick": pick["label"], "best": best["label"],
                    "regret": best["samples_per_s"] / pick["samples_per_s"],
                    "pick_over_best": pick["samples_per_s"] / best["samples_per_s"],
                    "pick_measured_rank": pick["measured_rank"],
                    "kendall_tau": kendall_tau([o["predicted_step_s"] for o in mine],
                                               [o["step_s"] for o in mine])})
    return out


def markdown(table: list[dict]) -> str:
    """The per-option table as the dated page shows it."""
    lines = ["| layout | Mbit/s | option | position | predicted step s | measured step s "
             "| samples/s (min-max) | runs | measured rank |", "|" + "---|" * 9]
    for o in table:
        label = f"**pick**: {o['label']}" if o["chosen"] else o["label"]
        lines.append(f"| {o['layout']} | {o['rate_mbit']} | {label} | {o['position']} | "
                     f"{o['predicted_step_s']:.3f} | {o['step_s']:.3f} | "
                     f"{o['samples_per_s']:.3f} ({o['samples_per_s_min']:.3f}-"
                     f"{o['samples_per_s_max']:.3f}) | {o['runs']} | {o['measured_rank']} |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def report(runs: list[dict], results: Path) -> None:
    """Print (and write) the per-option table and the verdicts of the runs."""
    table, points = option_table(runs), verdicts(runs)
    if table:
        write_csv(table, results / OPTIONS_TABLE)
        print(markdown(table))
    if points:
        write_csv(points, results / TABLE)
    for v in points:
        print(f"{v['layout']} {v['rate_mbit']:>5} ({v['mode']}): {v['options']} options, "
              f"{v['runs_per_option']}+ runs each; pick {v['pick']}: regret "
              f"{v['regret']:.3f} (best measured {v['best']}; goal <= 1.05), measured rank "
              f"{v['pick_measured_rank']}; Kendall tau {v['kendall_tau']:.2f} (goal >= 0.8)")


def run_row(option: dict, repeat: int, args) -> dict:
    run = run_point(option["config"], option["rate_mbit"], option["layout"], model=args.model,
                    steps=args.steps, results=args.results)
    return {**option, "repeat": repeat, "run_dir": str(run.run_dir),
            "samples_per_s": run.metrics["samples_per_s"], "step_s": run.metrics["step_s"],
            **run.load, "run": rundata.run_row(run.run_dir)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["200", "40"])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="2x2")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--neighbours", type=int, default=None, metavar="N",
                       help="the pick and the N options predicted next slower "
                            "(tune.export_neighbours)")
    which.add_argument("--count", type=int, default=None, metavar="K",
                       help="K options spread over the ranking (tune.export_ranked; the "
                            "default: 12)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs per option, interleaved (default: 3 with --neighbours, else 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps a run: 2 warm-up + the median's (default: 8 with "
                             "--neighbours, else 5)")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--predicted-only", action="store_true",
                        help="tune with tune.measure=false (no capture, no probes); the "
                             "default tunes as a user does, guard on")
    parser.add_argument("--from-runs", action="store_true", help="no new runs")
    parser.add_argument("--data", type=Path, default=None,
                        help="the runs' data file (default results/tables/tune_regret"
                             "[_neighbours].runs.jsonl)")
    parser.add_argument("--from-data", type=Path, default=None,
                        help="no new runs: the table and verdicts of a data file")
    args = parser.parse_args(argv)
    args.mode = "spread" if args.neighbours is None else "neighbours"
    if args.neighbours is not None and args.neighbours < 1:
        parser.error(f"--neighbours {args.neighbours}: use 1 or more (e.g. 3)")
    if args.count is not None and args.count < 2:
        parser.error(f"--count {args.count}: use 2 or more (the baseline and the pick)")
    args.export = (f"tune.export_neighbours={args.neighbours}" if args.mode == "neighbours"
                   else f"tune.export_ranked={args.count or 12}")
    for key, value in DEFAULTS[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.results = args.results.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    store = args.from_data or args.data or args.results / RUNS[args.mode]
    runs = rows_of(store) if store.exists() else []
    if args.from_data and not runs:
        raise SystemExit(f"no runs in {store}")
    if not (args.from_runs or args.from_data):
        todo = {rate: options(args.layout, rate, args.mode, args.export, runs, args)
                for rate in args.rates}
        done = Counter((*point_of(r), r["label"]) for r in runs)
        store.parent.mkdir(parents=True, exist_ok=True)
        for repeat, option in schedule(todo, args.repeats, done):
            row = run_row(option, repeat, args)
            runs.append(row)
            with store.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{args.layout} {option['rate_mbit']:>5} run {repeat}/{args.repeats} "
                  f"{option['label']:<40} predicted {option['predicted_step_s']:.3f} s, "
                  f"measured {row['step_s']:.3f} s"
                  f"{'  (the pick)' if option['chosen'] else ''}", flush=True)
    report(runs, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
