"""Execute every analysis/ notebook headless, per experiment, and check what it declared.

    python -m neoxlab.results.figures [--exp NAME] [--results results]

Tables that are missing, or older than a run dir of their experiment, are collected first
(neoxlab.results.tables), so the figures show the runs there are.

Notebooks are jupytext py:percent files; each names its outputs in a `# outputs:` line
(paths under the results dir, `{exp}` filled in). A `# needs runs: no` line marks one that
draws without run tables (analysis/paper_grid.py: from predictions), so an experiment that
has not run yet still gets its figures from those notebooks. The experiment and the directories are
passed by environment variables (NEOXLAB_EXP, NEOXLAB_RESULTS, NEOXLAB_TABLES,
NEOXLAB_FIGURES). A notebook that raises, or leaves a declared output missing, makes the
command exit non-zero, naming the notebook and the experiment.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import jupytext
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from neoxlab.files import REPO_ROOT
from neoxlab.results import tables as collect

ANALYSIS = REPO_ROOT / "analysis"
CELL_TIMEOUT_S = 300
PARALLEL = 4
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Outcome:
    notebook: str
    exp: str
    outputs: list[Path]
    error: str | None = None


def notebooks(analysis: Path = ANALYSIS) -> list[Path]:
    """analysis/*.py files that are notebooks (have `# %%` cells); helpers like style.py are not."""
    return sorted(
        p for p in analysis.glob("*.py")
        if any(line.startswith("# %%") for line in p.read_text().splitlines())
    )


def applies_to(notebook: Path, exp: str) -> bool:
    """A `# experiments: glob ... !glob ...` line limits a notebook to experiments matching
    a glob and no `!`-glob (training notebooks leave out the serve experiments)."""
    for line in notebook.read_text().splitlines():
        if line.startswith("# experiments:"):
            patterns = line.removeprefix("# experiments:").replace(",", " ").split()
            keep = [p for p in patterns if not p.startswith("!")]
            drop = [p[1:] for p in patterns if p.startswith("!")]
            return (any(fnmatch.fnmatch(exp, p) for p in keep)
                    and not any(fnmatch.fnmatch(exp, p) for p in drop))
    return True


def needs_runs(notebook: Path) -> bool:
    """False for a notebook with a `# needs runs: no` line; every other one reads run tables."""
    return not any(line.strip() == "# needs runs: no"
                   for line in notebook.read_text().splitlines())


def declared_outputs(notebook: Path, exp: str, results: Path) -> list[Path]:
    """Every path on the notebook's `# outputs:` lines (long lists may take several)."""
    names = []
    for line in notebook.read_text().splitlines():
        if line.startswith("# outputs:"):
            names += line.removeprefix("# outputs:").replace(",", " ").split()
    return [results / name.format(exp=exp) for name in names]


def experiments(tables: Path) -> list[str]:
    return sorted(p.name.removesuffix(".runs.parquet") for p in tables.glob("*.runs.parquet"))


def environment(exp: str, results: Path) -> dict[str, str]:
    """What a notebook reads to know its experiment and where tables and figures live."""
    return {
        "NEOXLAB_EXP": exp,
        "NEOXLAB_RESULTS": str(results.resolve()),
        "NEOXLAB_TABLES": str((results / "tables").resolve()),
        "NEOXLAB_FIGURES": str((results / "figures").resolve()),
        "MPLBACKEND": "Agg",
    }


def ipc_kernel(sockets: str) -> Config:
    """The kernel talks to us over Unix sockets in a private directory, not over TCP on
    localhost: nothing another user of the machine can connect to (and no warning from the
    kernel about unencrypted TCP in the output of `make figures`)."""
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(Path(sockets) / "kernel")  # socket paths: kernel-<n>
    return config


def execute(notebook: Path, exp: str, results: Path) -> Outcome:
    """Run one notebook in a fresh kernel (it inherits the environment set by main)."""
    outputs = declared_outputs(notebook, exp, results)
    nb = jupytext.read(notebook)
    for path in outputs:
        path.unlink(missing_ok=True)  # a stale file must not pass for a fresh one
    try:
        with tempfile.TemporaryDirectory(prefix="neoxlab-kernel-") as sockets:
            NotebookClient(
                nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", config=ipc_kernel(sockets),
                resources={"metadata": {"path": str(notebook.parent)}},
                shutdown_kernel="immediate",  # outputs are on disk: a graceful stop only waits
            ).execute()
    except CellExecutionError as err:
        return Outcome(notebook.name, exp, outputs, _describe(err))
    except Exception as err:  # kernel death, timeout: still name the notebook
        return Outcome(notebook.name, exp, outputs, f"{type(err).__name__}: {err}")
    missing = [str(p) for p in outputs if not p.exists()]
    if missing:
        return Outcome(notebook.name, exp, outputs, "declared but not written: "
                       + ", ".join(missing))
    return Outcome(notebook.name, exp, outputs)


def draw_one(name: str, exp: str, results: Path) -> int:
    """One notebook of analysis/ headless for one experiment, as `make figures` runs it (for a
    task that draws its own figure right after it ran); 1 with the error line if it failed."""
    notebook = ANALYSIS / name
    os.environ.update(environment(exp, results))
    outcome = execute(notebook, exp, results)
    if outcome.error:
        print(f"[neoxlab] figure failed: {notebook.name}: {outcome.error}", file=sys.stderr)
        return 1
    print(f"[neoxlab] figure: {', '.join(str(p) for p in outcome.outputs)}", flush=True)
    return 0


def _describe(err: CellExecutionError) -> str:
    """The error and the cell that raised it, without the terminal colour codes."""
    text = ANSI.sub("", str(err))
    cell = text.split("------------------")[1].strip() if "------------------" in text else ""
    shown = "\n".join("    " + line for line in cell.splitlines()[:12])
    return f"{err.ename}: {ANSI.sub('', err.evalue)}\n  in the cell:\n{shown}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neoxlab.results.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp", help="one experiment (default: every one with runs or tables)")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--analysis", type=Path, default=ANALYSIS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    tables = args.results / "tables"
    names = [args.exp] if args.exp else sorted(
        set(experiments(tables)) | set(collect.experiments_in(args.results)))
    for name in names:  # the figures of the runs there are: collect what is missing or stale
        reason = collect.needs_collecting(name, args.results)
        if reason:
            print(f"{name}: {reason}: collecting first", flush=True)
            collect.collect(name, args.results)
    books = notebooks(args.analysis)
    # runs collected, or tables a task wrote itself (task=tune: <exp>.tune.parquet)
    ran = {n for n in names if any(tables.glob(f"{n}.*.parquet"))}
    missing = [n for n in names if n not in ran and not any(
        applies_to(b, n) and not needs_runs(b) for b in books)]
    if not names or missing:
        which = f" EXP={missing[0]}" if missing else ""
        print(f"error: no runs and no tables for {missing or 'any experiment'} under "
              f"{args.results}/: run `make run{which}` first", file=sys.stderr)
        return 2
    failed: list[Outcome] = []
    for exp in names:
        os.environ.update(environment(exp, args.results))  # kernels inherit it
        start = time.perf_counter()
        mine = [b for b in books if applies_to(b, exp) and (exp in ran or not needs_runs(b))]
        if exp not in ran:
            print(f"{exp}: no runs yet: only the notebooks that draw without them", flush=True)
        # One kernel per notebook, all at once: each waits mostly on its own start-up.
        with ThreadPoolExecutor(max_workers=min(len(mine), PARALLEL) or 1) as pool:
            outcomes = list(pool.map(lambda b, e=exp: execute(b, e, args.results), mine))
        took = time.perf_counter() - start
        for outcome in outcomes:
            if outcome.error:
                failed.append(outcome)
                print(f"FAILED {exp} {outcome.notebook}", file=sys.stderr)
            else:
                shown = ", ".join(str(p) for p in outcome.outputs) or "no declared outputs"
                print(f"ok     {exp} {outcome.notebook} -> {shown}")
        print(f"{exp}: {len(mine)} of {len(books)} notebooks in {took:.1f} s")
    for outcome in failed:
        print(f"\nnotebook {outcome.notebook} failed for experiment {outcome.exp}:\n"
              f"{outcome.error}", file=sys.stderr)
    if failed:
        names_failed = ", ".join(f"{o.notebook} ({o.exp})" for o in failed)
        print(f"\nerror: {len(failed)} notebook(s) failed: {names_failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
