"""Did the guard reject a harmful scheme? The schemes a tune's stage (b) probed, trained
long: each probe's scheme (the rejected and the chosen) and the uncompressed baseline, from
scratch, for --steps steps (300) at --seeds train seeds (3), with the tune's own overrides
(its runs/<name>.log's command line). A rejected scheme must leave the band: its deviation
from the same-seed baseline (mean |loss - baseline| over the second half) above the
baselines' seed spread over the same steps (the loss study's measure). If it stays inside,
the guard rejected a harmless scheme and its budget or threshold is too tight.

    .venv/bin/python studies/guard_check.py --tune-dir results/tune/tune_local/<run_id> \\
        --data docs/measurements/data/<date>-guard-check.runs.jsonl
    .venv/bin/python studies/guard_check.py --from-data docs/measurements/data/<...>.jsonl

Every run's row (results/rundata.py: every step's loss and time, bytes per dimension) goes to
the data file as it finishes (a run already there for the same role, scheme and seed is
reused), and the table is computed from the rows alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from neoxlab.results import rundata

REPO = Path(__file__).resolve().parents[1]
DROP = ("launch.results_dir=", "launch.submit=", "train.steps=", "train.seed=",
        "train.checkpoint_every=", "train.keep_checkpoints=", "tune.capture_tensors=",
        "train.metrics_warmup_steps=", "resume")


def command_of(log: Path) -> list[str]:
    """The tuner's overrides of a run (its log's first line), less what this study sets."""
    first = log.read_text().splitlines()[0]
    args = shlex.split(first.removeprefix("$ python -m neoxlab "))
    return [a for a in args if not a.startswith(DROP)]


def schemes_of(tune_dir: Path) -> list[dict]:
    """The baseline and every probed scheme of a tune run, with the tuner's verdict."""
    summary = json.loads((tune_dir / "tune.json").read_text())
    runs = tune_dir / "runs"
    out = [{"role": "baseline", "label": "none", "args": command_of(runs / "baseline.log")}]
    for p in summary["probes"]:
        out.append({"role": "rejected" if not p["ok"] else "chosen", "label": p["label"],
                    "args": command_of(runs / f"{p['run']}.log"),
                    "probe_deviation": p["deviation"], "probe_threshold": p["threshold"]})
    return out


def train(args: list[str], results: Path) -> Path:
    (exp,) = [a.split("=", 1)[1] for a in args if a.startswith("experiment=")]
    before = set(results.glob(f"{exp}/*"))
    proc = subprocess.run([sys.executable, "-m", "neoxlab", *args,
                           f"launch.results_dir={results}"], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (new,) = set(results.glob(f"{exp}/*")) - before
    return new


def table(rows: list[dict]) -> list[dict]:
    """Per scheme: its deviation per seed from the same-seed baseline over the second half,
    and the baselines' seed spread over the same steps."""
    base = {r["seed"]: np.array(r["loss"], dtype=float) for r in rows if r["role"] == "baseline"}
    if len(base) < 2:
        raise ValueError(f"{len(base)} baseline seed(s) in the data: the band needs 2 or more")
    n = min(len(v) for v in base.values())
    late = slice(n // 2, n)
    spread = float(np.mean(np.ptp(np.array([v[:n] for v in base.values()])[:, late], axis=0)))
    out = []
    for label in dict.fromkeys(r["label"] for r in rows if r["role"] != "baseline"):
        mine = [r for r in rows if r["label"] == label and r["role"] != "baseline"]
        devs = {r["seed"]: float(np.mean(np.abs(np.array(r["loss"], dtype=float)[late]
                                                - base[r["seed"]][late])))
                for r in mine if r["seed"] in base}
        out.append({"role": mine[0]["role"], "label": label, "deviation": devs,
                    "mean_deviation": float(np.mean(list(devs.values()))), "band": spread,
                    "outside_band": all(d > spread for d in devs.values()),
                    "probe_deviation": mine[0].get("probe_deviation"),
                    "probe_threshold": mine[0].get("probe_threshold")})
    return out


def report(rows: list[dict]) -> None:
    n = len(rows[0]["loss"])
    print(f"| tuner's verdict | scheme | probe deviation / threshold | deviation per seed "
          f"(steps {n // 2 + 1}-{n}) | mean | seed band | outside the band |")
    print("|---|---|---|---|---|---|---|")
    for t in table(rows):
        per_seed = ", ".join(f"{s}: {d:.4f}" for s, d in sorted(t["deviation"].items()))
        print(f"| {t['role']} | {t['label']} | {t['probe_deviation']:.3g} / "
              f"{t['probe_threshold']:.3g} | {per_seed} | {t['mean_deviation']:.4f} | "
              f"{t['band']:.4f} | {'yes' if t['outside_band'] else 'no'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune-dir", type=Path, help="a task=tune run dir whose probes ran")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--results", type=Path, default=REPO / "results" / "guard_check")
    parser.add_argument("--data", type=Path, help="the data file the rows go to")
    parser.add_argument("--from-data", type=Path, help="no runs: the table of a data file")
    args = parser.parse_args()
    if args.from_data:
        report(rundata.read(args.from_data))
        return 0
    if not (args.tune_dir and args.data):
        parser.error("--tune-dir and --data (or --from-data)")
    done = {(r["role"], r["label"], r["seed"]) for r in (rundata.read(args.data)
                                                         if args.data.exists() else [])}
    for seed in args.seeds:
        for s in schemes_of(args.tune_dir):
            if (s["role"], s["label"], seed) in done:
                continue
            run_dir = train([*s["args"], f"train.steps={args.steps}", f"train.seed={seed}"],
                            args.results.resolve())
            extra = {k: s[k] for k in ("probe_deviation", "probe_threshold") if k in s}
            rundata.append(args.data, [rundata.run_row(
                run_dir, role=s["role"], label=s["label"], seed=seed,
                tune_dir=str(args.tune_dir), **extra)])
            print(f"seed {seed} {s['role']} {s['label']}: {run_dir}", flush=True)
    report(rundata.read(args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
