"""The loss-vs-rate map: each dimension compressed alone, at ZFP rates 2, 4 and 8 and int4 in
fp32 and at ZFP rates 4 and 8 in bf16, against the baseline of the same seed and precision
(experiment loss_rate_map: the loss study's layout, neox_tiny, 150 steps; 3 seeds). It is
the material of task=tune's error budget: where a dimension's loss starts to leave the seed
band, and what proxy error (tune/proxy.py, on the baseline runs' captured messages) the
codec had there.

    .venv/bin/python studies/loss_rate_map.py                   # every run it lacks, then the map
    .venv/bin/python studies/loss_rate_map.py --seeds 1 --dims tp     # a part of it
    .venv/bin/python studies/loss_rate_map.py --from-runs             # the map of the runs there
    .venv/bin/python studies/loss_rate_map.py --from-data             # the committed map's table

task=tune's budgets are computed from the committed rows (neoxlab.config.budget_map reads
docs/measurements/data/2026-12-04-loss-rate-map.rate_map.csv); `--data PATH` writes a new
map's rows there in the same columns.

Finished runs (all steps logged, same model and steps) are reused, so a map cut short goes on
with the runs it lacks, across sessions. Seed by seed, baselines first.

Writes results/tables/loss_rate_map.rate_map.csv (precision, dim, codec: mean |loss - the
same-seed baseline| over the second half, mean over seeds, the baseline's seed spread over
the same steps, the proxy error, hurts = deviation > the deviation of naive's codec, ZFP
rate 8, on the same dimension and precision), .curves.csv (every step) and
.budget.csv: per dimension the error budget the map supports for task=tune's proxy (the
largest proxy error of a harmless codec below every harmful codec's; `budgets()`);
`make figures EXP=loss_rate_map` draws the map.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from neoxlab.config.budget_map import MAP_FILE, budgets, judge, read_rows

REPO = Path(__file__).resolve().parents[1]
EXP = "loss_rate_map"
POINTS = {"fp32": ["zfp:rate=2", "zfp:rate=4", "zfp:rate=8", "int4"],
          "bf16": ["zfp:rate=4", "zfp:rate=8"]}
DIMS = ("tp", "dp", "zero")  # the layout's dimensions (TP=2 x DP=2, ZeRO-1, no pipeline)
# The bar a codec's deviation is held to (budget_map.REFERENCE): naive's codec on the same
# dimension and precision. The seed spread (the first map's bar) let int4 on DP gradients
# through, and the pick that used it deviated from the same-seed baseline more than naive
# does (neox_small, 300 steps, docs/measurements/2026-12-04-tune.md).
CAPTURE = 4  # messages per dimension the baselines keep for the proxy


def point_args(precision: str, dim: str | None, codec: str | None, seed: int, args) -> list[str]:
    out = [f"experiment={EXP}", f"train.precision={precision}", f"train.seed={seed}",
           f"train.steps={args.steps}", f"model={args.model}", "compression=per_dim",
           f"compression.scheme={'none' if dim is None else scheme_name(dim, codec)}",
           f"launch.results_dir={args.results}"]
    if dim is None:
        return [*out, f"tune.capture_tensors={CAPTURE}"]
    name, _, params = codec.partition(":")
    out.append(f"compression.dims.{dim}.compressor={name}")
    out += [f"+compression.dims.{dim}.params.{p}" for p in filter(None, params.split(","))]
    return out


def scheme_name(dim: str, codec: str) -> str:
    """'tp-zfp-rate2': a run id's scheme part, free of the override grammar's ':' and '='."""
    return f"{dim}-" + codec.replace(":", "-").replace("=", "").replace(",", "-")


def run(args_: list[str], results: Path) -> Path:
    before = set(run_dirs(results))
    proc = subprocess.run([sys.executable, "-m", "neoxlab", *args_], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args_)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (new,) = set(run_dirs(results)) - before
    return new


def run_dirs(results: Path) -> list[Path]:
    root = results / EXP
    return sorted(root.iterdir()) if root.exists() else []


def key_of(cfg: dict) -> tuple[str, str | None, str | None, int]:
    """(precision, dim, codec spec, seed) of a run's config.json."""
    dims = {d: v for d, v in cfg["compression"]["dims"].items() if v["compressor"] != "none"}
    dim, codec = None, None
    if dims:
        (dim, v), = dims.items()
        params = ",".join(f"{k}={p}" for k, p in sorted(v["params"].items()))
        codec = v["compressor"] + (f":{params}" if params else "")
    return cfg["train"]["precision"], dim, codec, int(cfg["train"]["seed"])


def finished(results: Path, steps: int, model: str) -> dict[tuple, Path]:
    found = {}
    for run_dir in run_dirs(results):
        metrics = run_dir / "metrics.jsonl"
        if not metrics.exists() or len(metrics.read_text().splitlines()) != steps:
            continue
        cfg = json.loads((run_dir / "config.json").read_text())
        if cfg["model"]["name"] == model:
            found[key_of(cfg)] = run_dir
    return found


def losses(run_dir: Path) -> np.ndarray:
    return np.array([json.loads(line)["loss"] for line in
                     (run_dir / "metrics.jsonl").read_text().splitlines()])


def proxy_error(run_dir: Path, dim: str, codec: str) -> float | None:
    from neoxlab.comm.capture import load
    from neoxlab.tune.proxy import relative_error

    if not (run_dir / "capture").exists():
        return None
    return relative_error(codec, load(run_dir).get(dim, []))


def write_csv(path: Path, data: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def report(rows: list[dict], budget: list[dict]) -> None:
    """The map's table (markdown, as the measurement page has it) and the budgets."""
    print("| precision | dim | codec | deviation | seed spread | proxy error | naive's "
          "deviation | verdict |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = "-" if r["proxy_error"] is None else f"{r['proxy_error']:.3g}"
        naive = "-" if r["naive_deviation"] is None else f"{r['naive_deviation']:.4f}"
        print(f"| {r['precision']} | {r['dim']} | {r['codec']} | {r['deviation']:.4f} | "
              f"{float(r['seed_spread']):.4f} | {err} | {naive} | "
              f"{'hurts' if r['hurts'] else 'no worse than naive'} |")
    for b in budget:
        print(f"tune.error_budget.{b['dim']}={b['budget']} (smallest harmful proxy "
              f"{b['smallest_harmful_proxy']}, {b['codecs']} codecs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--dims", nargs="+", default=list(DIMS))
    parser.add_argument("--precisions", nargs="+", default=list(POINTS))
    parser.add_argument("--codecs", nargs="+", default=None, help="a part of each precision's")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--model", default="neox_tiny")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--from-runs", action="store_true", help="no new runs")
    parser.add_argument("--from-data", type=Path, nargs="?", const=MAP_FILE, default=None,
                        help="the table and budgets of a map's committed rows (default: the "
                             "one task=tune reads), no runs")
    parser.add_argument("--data", type=Path, default=None,
                        help="also write the map's rows here (docs/measurements/data/...)")
    args = parser.parse_args()
    if args.from_data is not None:
        rows = read_rows(args.from_data)
        judge(rows)
        report(rows, budgets(rows))
        return 0
    args.results = args.results.resolve()
    points = {p: [c for c in POINTS[p] if args.codecs is None or c in args.codecs]
              for p in args.precisions}
    done = finished(args.results, args.steps, args.model)
    if not args.from_runs:
        for seed in args.seeds:
            for precision in args.precisions:
                todo = [(None, None)] + [(d, c) for d in args.dims for c in points[precision]]
                for dim, codec in todo:
                    key = (precision, dim, codec, seed)
                    if key not in done:
                        done[key] = run(point_args(precision, dim, codec, seed, args),
                                        args.results)
                    print(f"{precision} {dim or 'baseline'} {codec or ''} seed {seed}: "
                          f"{done[key].name}", flush=True)
    rows, curves = [], []
    for precision in args.precisions:
        bases = {s: losses(done[(precision, None, None, s)]) for s in args.seeds
                 if (precision, None, None, s) in done}
        if len(bases) < 2:
            print(f"{precision}: no map yet (needs 2 or more finished baseline seeds)")
            continue
        late = slice(args.steps // 2, args.steps)
        stack = np.array(list(bases.values()))
        spread = float(np.mean(np.ptp(stack[:, late], axis=0)))
        for dim in args.dims:
            for codec in points[precision]:
                devs = []
                for seed, base in bases.items():
                    run_dir = done.get((precision, dim, codec, seed))
                    if run_dir is None:
                        continue
                    loss = losses(run_dir)
                    devs.append(float(np.mean(np.abs(loss[late] - base[late]))))
                    curves += [{"precision": precision, "dim": dim, "codec": codec,
                                "seed": seed, "step": i + 1, "loss": float(v),
                                "baseline": float(b)} for i, (v, b) in
                               enumerate(zip(loss, base, strict=True))]
                if not devs:
                    continue
                first_base = done[(precision, None, None, min(bases))]
                err = proxy_error(first_base, dim, codec)
                rows.append({"precision": precision, "dim": dim, "codec": codec,
                             "seeds": len(devs), "deviation": float(np.mean(devs)),
                             "seed_spread": spread, "proxy_error": err})
    judge(rows)
    tables = args.results / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    budget = budgets(rows)
    if args.data is not None:
        write_csv(args.data, [{k: r[k] for k in ("precision", "dim", "codec", "seeds",
                                                   "deviation", "seed_spread", "proxy_error")}
                              for r in rows])
    for name, data in (("rate_map", rows), ("curves", curves), ("budget", budget)):
        if data:
            write_csv(tables / f"{EXP}.{name}.csv", data)
    report(rows, budget)
    print(f"table: {tables / f'{EXP}.rate_map.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
