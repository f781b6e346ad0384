"""The tuner's regret on the emulated cluster: at each rate, task=tune (guard on;
`--predicted-only`: tune.measure=false) exports up to --count options spread over its
predicted ranking (tune.export_ranked: guard-passing single-dimension candidates and
schemes, the baseline and the pick among them); each runs once for real (experiment
emulated_sweep's layout), interleaved over the rates. Per rate it prints the pick's measured
samples/s over the best measured option's (goal: within 5 %) and Kendall's tau between the
predicted and measured step times (goal: 0.8 or more).

Needs root + iproute2 and the in-situ profile of each rate (task=tune measures it when it
is missing); run it alone:
    .venv/bin/python studies/tune_regret.py --rates 200 40
    .venv/bin/python studies/tune_regret.py --from-runs      # the verdicts of the runs there
    .venv/bin/python studies/tune_regret.py --rates 200 40 \\
        --data docs/measurements/data/<date>-tune-regret.runs.jsonl
    .venv/bin/python studies/tune_regret.py --from-data docs/measurements/data/<...>.jsonl

Runs are kept in results/tables/tune_regret.runs.jsonl, or the --data file (a later call skips
the options it finds there, so a cut-short study goes on); each row holds the option, its
prediction and its run's row (results/rundata.py: every step's time and loss, bytes per
dimension), so the verdicts are regenerated from the file alone; the table is
results/tables/tune_regret.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

from sweep_points import run_point, tune_point
from sweep_runs import LAYOUTS, rows_of

from neoxlab.files import REPO_ROOT
from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
RUNS = Path("tables") / "tune_regret.runs.jsonl"
TABLE = Path("tables") / "tune_regret.csv"


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-a of two equally long sequences (pairs tied in either count as 0)."""
    def sign(v: float) -> int:
        return (v > 0) - (v < 0)

    n = len(xs)
    score = sum(sign(xs[i] - xs[j]) * sign(ys[i] - ys[j])
                for i in range(n) for j in range(i + 1, n))
    return score / (n * (n - 1) / 2)


def options(layout: str, rate: str, count: int, args) -> list[dict]:
    """Tune the point with the ranked export; each option copied to configs/compression under
    a name of its own (git-ignored: tuned_*), with its prediction."""
    pick = tune_point(rate, layout, model=args.model, results=args.results,
                      extra=(f"tune.export_ranked={count}",), measure=not args.predicted_only)
    out = []
    for entry in json.loads((pick.tune_dir / "ranked.json").read_text()):
        name = re.sub(r"[^A-Za-z0-9_]", "_", f"tuned_rank_{layout}_{rate}_{entry['name']}")
        text = (pick.tune_dir / "ranked" / f"{entry['name']}.yaml").read_text()
        text = text.replace(f"scheme: {entry['name']}", f"scheme: {name}")
        (REPO_ROOT / "configs" / "compression" / f"{name}.yaml").write_text(text)
        out.append({**entry, "config": name, "layout": layout, "rate_mbit": rate,
                    "tune_dir": str(pick.tune_dir)})
    return out


def verdicts(runs: list[dict]) -> list[dict]:
    """Per (layout, rate): regret of the pick and the model's ranking against the runs."""
    out = []
    for key in dict.fromkeys((r["layout"], r["rate_mbit"]) for r in runs):
        mine = [r for r in runs if (r["layout"], r["rate_mbit"]) == key]
        chosen = [r for r in mine if r["chosen"]]
        if len(mine) < 2 or not chosen:
            continue
        best = max(mine, key=lambda r: r["samples_per_s"])
        out.append({"layout": key[0], "rate_mbit": key[1], "options": len(mine),
                    "pick": chosen[0]["label"], "best": best["label"],
                    "pick_over_best": chosen[0]["samples_per_s"] / best["samples_per_s"],
                    "kendall_tau": kendall_tau([r["predicted_step_s"] for r in mine],
                                               [r["step_s"] for r in mine])})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["200", "40"])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="2x2")
    parser.add_argument("--count", type=int, default=12, help="options run per rate")
    parser.add_argument("--steps", type=int, default=5, help="2 warm-up steps + the median's")
    parser.add_argument("--model", default="neox_small")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--predicted-only", action="store_true",
                        help="tune with tune.measure=false (no capture, no probes); the "
                             "default tunes as a user does, guard on")
    parser.add_argument("--from-runs", action="store_true", help="no new runs")
    parser.add_argument("--data", type=Path, default=None,
                        help="the runs' data file (default results/tables/tune_regret.runs.jsonl)")
    parser.add_argument("--from-data", type=Path, default=None,
                        help="no new runs: the verdicts of a data file")
    args = parser.parse_args()
    args.results = args.results.resolve()
    store = args.from_data or args.data or args.results / RUNS
    runs = rows_of(store) if store.exists() else []
    if args.from_data and not runs:
        parser.error(f"no runs in {store}")
    if not (args.from_runs or args.from_data):
        done = {(r["layout"], r["rate_mbit"], r["label"]) for r in runs}
        todo = {rate: [o for o in options(args.layout, rate, args.count, args)
                       if (args.layout, rate, o["label"]) not in done] for rate in args.rates}
        store.parent.mkdir(parents=True, exist_ok=True)
        for i in range(max(map(len, todo.values()), default=0)):
            for rate in args.rates:
                if i >= len(todo[rate]):
                    continue
                option = todo[rate][i]
                run = run_point(option["config"], rate, args.layout, model=args.model,
                                steps=args.steps, results=args.results)
                row = {**option, "run_dir": str(run.run_dir),
                       "samples_per_s": run.metrics["samples_per_s"],
                       "step_s": run.metrics["step_s"], **run.load,
                       "run": rundata.run_row(run.run_dir)}
                runs.append(row)
                with store.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{args.layout} {rate:>5} {option['label']:<40} predicted "
                      f"{option['predicted_step_s']:.3f} s, measured {row['step_s']:.3f} s"
                      f"{'  (the pick)' if option['chosen'] else ''}", flush=True)
    table = verdicts(runs)
    if table:
        with (args.results / TABLE).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    for v in table:
        print(f"{v['layout']} {v['rate_mbit']:>5}: {v['options']} options run; pick "
              f"{v['pick']} at {v['pick_over_best']:.3f}x the best measured ({v['best']}; "
              f"goal >= 0.95); Kendall tau {v['kendall_tau']:.2f} (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
