"""Loss study: every scheme x seed of experiment loss_study (same layout, data and steps;
train.seed varies the initialisation), then the verdict: does a scheme's mean loss leave
the baseline's seed band (min..max over seeds) over the last half of training?

    .venv/bin/python studies/loss_study.py                  # 4 schemes x 3 seeds
    .venv/bin/python studies/loss_study.py --model neox_small --steps 300
    .venv/bin/python studies/loss_study.py --steps 120 --from-runs     # finished runs only
    .venv/bin/python studies/loss_study.py --data docs/measurements/data/<date>-loss.runs.jsonl
    .venv/bin/python studies/loss_study.py --from-data docs/measurements/data/<...>.runs.jsonl

Finished runs (same model and step count, all steps logged) are reused, so a study that was
stopped goes on with the runs it lacks.

Writes results/tables/loss_study.curves.csv (scheme, seed, step, loss, smoothed loss) and
prints per scheme its final loss (mean over seeds) and the share of late steps outside the
band; `make figures EXP=loss_study` draws the curves with their bands.
--data: every run's row (results/rundata.py: its config, every step's time and loss, bytes
per dimension; labelled with scheme and seed) written to a data file; --from-data prints the
same tables from such a file alone, after the run dirs are gone.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("none", "naive", "zhybrid", "mzhybrid")
SMOOTH = 20  # steps in the moving average the band and verdict compare
OUTSIDE = 0.5  # a scheme leaves the band when its mean is outside it on most late steps


class Curve(NamedTuple):
    """One run's loss at every step, and where it ran."""

    loss: np.ndarray
    run_dir: str


def run(scheme: str, seed: int, args) -> Path:
    cmd = [sys.executable, "-m", "neoxlab", "experiment=loss_study", f"compression={scheme}",
           f"train.seed={seed}", f"train.steps={args.steps}", f"model={args.model}",
           f"launch.results_dir={args.results}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return sorted((args.results / "loss_study").iterdir())[-1]


def finished_runs(results: Path, steps: int, model: str) -> dict[tuple[str, int], Path]:
    """(scheme, seed) -> the newest run dir of loss_study with `model` and `steps` logged
    steps (a run that stopped early has fewer)."""
    found: dict[tuple[str, int], Path] = {}
    root = results / "loss_study"
    for run_dir in sorted(root.iterdir()) if root.exists() else []:
        metrics = run_dir / "metrics.jsonl"
        if not metrics.exists() or len(metrics.read_text().splitlines()) != steps:
            continue
        cfg = json.loads((run_dir / "config.json").read_text())
        if cfg["model"]["name"] == model:
            found[(cfg["compression"]["scheme"], int(cfg["train"]["seed"]))] = run_dir
    return found


def smooth(loss: np.ndarray, k: int = SMOOTH) -> np.ndarray:
    """Trailing moving average (shorter at the start)."""
    c = np.cumsum(np.insert(loss, 0, 0.0))
    end = np.arange(1, len(loss) + 1)
    start = np.maximum(end - k, 0)
    return (c[end] - c[start]) / (end - start)


def verdict(curves: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per scheme: mean final smoothed loss, the share of the last half's steps where its
    mean over seeds lies outside the baseline's min..max band, and seed by seed its mean and
    largest |smoothed loss - the same seed's baseline| over the last half (curves hold the
    same seeds in the same order; a scheme with fewer seeds gets no same-seed deviation)."""
    base = curves["none"]
    lo, hi = base.min(axis=0), base.max(axis=0)
    half = base.shape[1] // 2
    out = {}
    for scheme, c in curves.items():
        mean = c.mean(axis=0)
        outside = ((mean < lo) | (mean > hi))[half:].mean()
        gap = np.abs(c - base)[:, half:] if c.shape == base.shape else None
        out[scheme] = {"final": float(mean[-1]), "spread": float(np.ptp(c[:, -1])),
                       "outside_late": float(outside), "leaves_band": bool(outside > OUTSIDE),
                       "same_seed_mean": None if gap is None else gap.mean(axis=1).tolist(),
                       "same_seed_max": None if gap is None else gap.max(axis=1).tolist()}
    return out


def losses_of_runs(done: dict[tuple[str, int], Path]) -> dict[tuple[str, int], Curve]:
    """(scheme, seed) -> its loss at every step and its run dir, from the run dirs."""
    return {key: Curve(np.array([json.loads(line)["loss"] for line in
                                 (d / "metrics.jsonl").read_text().splitlines()]), str(d))
            for key, d in done.items()}


def losses_of_data(path: Path) -> dict[tuple[str, int], Curve]:
    """The same from a --data file: the run dirs may be gone."""
    return {(r["scheme"], int(r["seed"])): Curve(np.array(r["loss"], dtype=float), r["run_dir"])
            for r in rundata.read(path)}


def data_rows(done: dict[tuple[str, int], Path]) -> list[dict]:
    """Every run's row for the --data file, labelled with its scheme and seed."""
    return [rundata.run_row(d, scheme=scheme, seed=seed) for (scheme, seed), d in done.items()]


def report(runs: dict[tuple[str, int], Curve], schemes: list[str], seeds: list[int]
           ) -> tuple[list[dict], dict[str, dict] | None]:
    """Prints per run its final loss, the table of smoothed final losses (as the measurement
    page has it) and per scheme the verdict; returns the curves' rows and the verdict."""
    rows, curves, finals = [], {}, {}
    for scheme in schemes:
        per_seed = []
        for seed in seeds:
            if (scheme, seed) not in runs:
                continue
            loss, run_dir = runs[(scheme, seed)]
            s = smooth(loss)
            per_seed.append(s)
            finals[(scheme, seed)] = float(s[-1])
            rows += [{"scheme": scheme, "seed": seed, "step": i + 1, "loss": float(v),
                      "loss_smooth": float(w), "run_dir": run_dir}
                     for i, (v, w) in enumerate(zip(loss, s, strict=True))]
            print(f"{scheme:<9} seed {seed}: final loss {loss[-1]:.4f} "
                  f"(smoothed {s[-1]:.4f})  {Path(run_dir).name}", flush=True)
        if per_seed:
            curves[scheme] = np.array(per_seed)
    steps = {len(c) for c, _ in runs.values()}
    print(f"\nSmoothed loss ({SMOOTH}-step mean) at step {max(steps) if steps else '-'}:\n")
    print("| scheme | " + " | ".join(f"seed {s}" for s in seeds)
          + " | mean | spread over seeds |\n|---|" + "---|" * (len(seeds) + 2))
    for scheme, c in curves.items():
        cells = [f"{finals[(scheme, s)]:.4f}" if (scheme, s) in finals else "-" for s in seeds]
        print(f"| {scheme} | " + " | ".join(cells)
              + f" | {c[:, -1].mean():.4f} | {np.ptp(c[:, -1]):.4f} |")
    if "none" not in curves or len(curves["none"]) < 2:
        print("no verdict: the baseline's seed band needs 2 or more finished seeds of none")
        return rows, None
    verdicts = verdict(curves)
    for scheme, v in verdicts.items():
        print(f"{scheme:<9} final {v['final']:.4f} (seed spread {v['spread']:.4f}); mean "
              f"outside the baseline band on {v['outside_late']:.0%} of the last half: "
              f"{'leaves' if v['leaves_band'] else 'stays in'} the band")
        if v["same_seed_mean"] is not None and scheme != "none":
            print(f"{'':<9} same-seed deviation, last half, per seed: mean " + " / ".join(
                f"{d:.4f}" for d in v["same_seed_mean"]) + ", max " + " / ".join(
                f"{d:.4f}" for d in v["same_seed_max"]))
    return rows, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="neox_tiny")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--from-runs", action="store_true",
                        help="no new runs: the finished runs already there")
    parser.add_argument("--data", type=Path, default=None,
                        help="write every run's row to this data file")
    parser.add_argument("--from-data", type=Path, default=None,
                        help="no runs: the tables of a data file")
    args = parser.parse_args()
    if args.from_data is not None:
        runs = losses_of_data(args.from_data)
        schemes = list(dict.fromkeys(s for s, _ in runs))
        report(runs, schemes, sorted({seed for _, seed in runs}))
        return 0
    args.results = args.results.resolve()
    # finished runs are kept, so a study cut short goes on where it stopped
    done = finished_runs(args.results, args.steps, args.model)
    if not args.from_runs:  # seed by seed, so a study cut short still has every scheme
        for seed in args.seeds:
            for scheme in args.schemes:
                if (scheme, seed) not in done:
                    done[(scheme, seed)] = run(scheme, seed, args)
                print(f"{scheme} seed {seed}: {done[(scheme, seed)].name}", flush=True)
    done = {(scheme, seed): done[(scheme, seed)] for scheme in args.schemes
            for seed in args.seeds if (scheme, seed) in done}
    if args.data is not None:
        rundata.append(args.data, data_rows(done))
    rows, _ = report(losses_of_runs(done), args.schemes, args.seeds)
    out = args.results / "tables" / "loss_study.curves.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"table: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
