"""Run dirs -> tidy tables under results/tables/, the only input of the analysis notebooks.

    python -m neoxlab.results.tables [--exp NAME] [--results results] [--log neox.out ...]

Per experiment: <exp>.runs.parquet/.csv (one row per run, every status), <exp>.steps.parquet
(one row per logged step), <exp>.comm.parquet (bytes and seconds per dimension and op) and
<exp>.compare.parquet/.csv (per scheme against the `none` baseline at the same GPU count),
so that every figure and the summary table take their numbers from the same place. Serve
runs add <exp>.serve.parquet/.csv (one row per engine and arrival gap) and
<exp>.serve_requests.parquet (one row per served request).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import yaml

from neoxlab.files import REPO_ROOT, atomic_path
from neoxlab.results import RUN_KEYS
from neoxlab.results.load import COMM_FIELDS, STEP_FIELDS, Malformed, Run, find_run_dirs, load_run
from neoxlab.results.serve import POLICY_FIELDS, REQUEST_FIELDS

BASELINE = "none"
# folders of results/ that hold no experiment (a task's own folder, e.g. task=predict's, holds
# its run dirs one level further down, under their experiment's name: see experiments_in)
NOT_EXPERIMENTS = {"tables", "figures", "calibration"}
CONTEXT = ["model", "gpus"]  # what must match for two schemes to be compared


def comparison_members(exp: str, experiments_dir: Path = REPO_ROOT / "experiments") -> list[str]:
    """The experiments a comparison runs in order (its `runs:` list), [] for a plain one."""
    path = experiments_dir / f"{exp}.yaml"
    if not path.exists():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    return [str(name) for name in data.get("runs") or []]


def run_dirs(results: Path, exp: str, latest: bool = False) -> list[Path]:
    """The experiment's own run dirs, plus those of the experiments it runs, if a comparison.

    latest: only the newest run of each (run ids start with their start time), so a
    comparison's figures show the runs just made, not every earlier attempt."""
    groups = [find_run_dirs(results / exp)]
    groups += [find_run_dirs(results / m) for m in comparison_members(exp)]
    dirs: list[Path] = []
    for group in groups:
        chosen = sorted(group)[-1:] if latest else group
        dirs += [d for d in chosen if d not in dirs]
    return dirs


def runs_table(runs: list[Run], group: str) -> pd.DataFrame:
    frame = pd.DataFrame([run.row for run in runs])
    frame.insert(0, "group", group)
    return frame


def _per_run(runs: list[Run], group: str, attr: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """Rows of every run's steps or comm records, tagged with the run; columns even if empty."""
    rows = [
        {"group": group, **{k: run.row[k] for k in RUN_KEYS}, **rec}
        for run in runs for rec in getattr(run, attr)
    ]
    frame = pd.DataFrame(rows)
    for col in ("group", *RUN_KEYS, *columns):
        if col not in frame:
            frame[col] = pd.Series(dtype="float64" if col not in RUN_KEYS else "object")
    return frame


def serve_tables(runs: list[Run], group: str) -> dict[str, pd.DataFrame]:
    """Policy and request tables of the serve runs; none when no run served."""
    if not any(run.row.get("task") == "serve" or run.serve for run in runs):
        return {}
    return {"serve": _rows(runs, group, "serve", POLICY_FIELDS),
            "serve_requests": _rows(runs, group, "serve_requests", REQUEST_FIELDS)}


def _rows(runs: list[Run], group: str, attr: str, columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame([{"group": group, **rec} for run in runs for rec in getattr(run, attr)])
    for col in ("group", *columns):
        if col not in frame:
            frame[col] = pd.Series(dtype="object")
    return frame


def steps_table(runs: list[Run], group: str) -> pd.DataFrame:
    return _per_run(runs, group, "steps", (*STEP_FIELDS, "loss_smooth"))


def comm_table(runs: list[Run], group: str) -> pd.DataFrame:
    return _per_run(runs, group, "comm", ("rank", "dim", "op", *COMM_FIELDS))


def compare_schemes(runs: pd.DataFrame) -> pd.DataFrame:
    """Median over completed runs per (model, GPUs, scheme), and the gain over `none` there.

    Gains are (scheme / baseline - 1) * 100 of TFLOPS/GPU and samples/s; the loss delta is
    the scheme's final loss minus the baseline's. No baseline at that GPU count -> NaN.
    """
    cols = CONTEXT + [
        "scheme", "runs", "tflops_per_gpu", "samples_per_s", "mfu", "final_loss",
        "final_loss_smooth", "tflops_gain_pct", "samples_gain_pct", "final_loss_delta",
    ]
    done = runs[(runs["status"] == "completed") & runs["median_tflops_per_gpu"].notna()]
    if done.empty:
        return pd.DataFrame(columns=cols)
    table = (
        done.groupby(CONTEXT + ["scheme"], dropna=False)
        .agg(
            runs=("run_id", "count"),
            tflops_per_gpu=("median_tflops_per_gpu", "median"),
            samples_per_s=("median_samples_per_s", "median"),
            mfu=("median_mfu", "median"),
            final_loss=("final_loss", "median"),
            final_loss_smooth=("final_loss_smooth", "median"),
        )
        .reset_index()
    )
    base = table.loc[table["scheme"] == BASELINE,
                     CONTEXT + ["tflops_per_gpu", "samples_per_s", "final_loss"]]
    joined = table.merge(base, on=CONTEXT, how="left", suffixes=("", "_base"))
    table["tflops_gain_pct"] = (joined["tflops_per_gpu"] / joined["tflops_per_gpu_base"] - 1) * 100
    table["samples_gain_pct"] = (joined["samples_per_s"] / joined["samples_per_s_base"] - 1) * 100
    table["final_loss_delta"] = joined["final_loss"] - joined["final_loss_base"]
    return table[cols]


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """Parquet or CSV by suffix, replaced atomically (a reader never sees half a table)."""
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)


def collect(
    exp: str, results: Path, logs: list[Path] | None = None, latest: bool = False
) -> dict[str, pd.DataFrame]:
    """Load every run of `exp` (and GPT-NeoX logs given alone), write its tables, return them."""
    runs = [load_run(d) for d in run_dirs(results, exp, latest)]
    runs += [load_run(log.parent, log=log) for log in logs or []]
    if not runs:
        raise FileNotFoundError(
            f"no runs for experiment {exp!r} under {results / exp}: run `make run EXP={exp}` "
            "first, or pass --log with a GPT-NeoX stdout log"
        )
    for run in runs:
        run.row["experiment"] = run.row["experiment"] or exp
    tables = {
        "runs": runs_table(runs, exp),
        "steps": steps_table(runs, exp),
        "comm": comm_table(runs, exp),
    }
    tables["compare"] = compare_schemes(tables["runs"])
    tables.update(serve_tables(runs, exp))
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_table(frame, out / f"{exp}.{name}.parquet")
        if name in ("runs", "compare", "serve"):
            write_table(frame, out / f"{exp}.{name}.csv")
    _report(exp, runs, out, tables)
    return tables


def _report(exp: str, runs: list[Run], out: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Say what was found, including runs that did not complete and lines that were skipped."""
    states = Counter(run.row["status"] for run in runs)
    names = ",".join(tables)
    print(f"{exp}: {len(runs)} runs (" + ", ".join(f"{n} {s}" for s, n in states.items())
          + f") -> {out}/{exp}.{{{names}}}.parquet")
    bad: list[Malformed] = [m for run in runs for m in run.malformed]
    if bad:
        print(f"  {len(bad)} malformed lines skipped, first ones:")
        for m in bad[:5]:
            print(f"    {m.source}:{m.lineno}: {m.reason}: {m.line[:100]}")


def needs_collecting(exp: str, results: Path) -> str | None:
    """Why `exp`'s tables must be (re)written before drawing: never collected, or a run dir
    changed after them (a new run, a run that went on); None when they are current, or when
    there are no run dirs to collect (tables alone are drawn as they are)."""
    dirs = run_dirs(results, exp)
    table = results / "tables" / f"{exp}.runs.parquet"
    if not dirs:
        return None
    if not table.exists():
        return f"{len(dirs)} run(s), not collected yet"
    written = table.stat().st_mtime
    changed = [d for d in dirs if max(p.stat().st_mtime for p in (d, *d.iterdir())) > written]
    if changed:
        return f"{len(changed)} of {len(dirs)} run(s) changed since the tables were written"
    return None


def experiments_in(results: Path) -> list[str]:
    """The experiments with run dirs under results/: folders whose run dirs sit right in them
    (results/<exp>/<run_id>/), not a task's own folder (results/<folder>/<exp>/<run_id>/)."""
    if not results.is_dir():
        return []
    return sorted(
        p.name for p in results.iterdir()
        if p.is_dir() and p.name not in NOT_EXPERIMENTS and any(
            run.parent == p for run in find_run_dirs(p))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.results.tables", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp", help="one experiment (default: every one under --results)")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--log", type=Path, action="append", default=[],
                        help="a GPT-NeoX stdout log to add to --exp (repeatable)")
    parser.add_argument("--latest", action="store_true",
                        help="only the newest run of the experiment and of each member")
    args = parser.parse_args(argv)
    if args.log and not args.exp:
        parser.error("--log needs --exp: the experiment whose tables the log joins")
    names = [args.exp] if args.exp else experiments_in(args.results)
    if not names:
        print(f"no run dirs under {args.results}/: run `make run` first", file=sys.stderr)
        return 2
    try:
        for name in names:
            collect(name, args.results, args.log if name == args.exp else None, args.latest)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
