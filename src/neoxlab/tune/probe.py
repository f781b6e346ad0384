"""The tuner's real runs: training runs of the experiment itself, started as a user starts
them (`python -m neoxlab experiment=<exp> ... task=train`), each under its own results dir
inside the tune run dir (runs/<name>/), so a tune run keeps everything it measured.

- the baseline run: uncompressed, warmup + probe steps, a checkpoint after the warm-up
  (the shared checkpoint), the first messages of every dimension captured (stage a); its
  steps after the checkpoint are the same-seed baseline of every probe;
- noise runs: uncompressed from the shared checkpoint with other data orders (data.seed),
  as many steps as a probe: the loss spread a probe can show without compression;
- probes: a scheme from the shared checkpoint (planned with launch.submit=false, the
  checkpoint linked in, then `python -m neoxlab resume`), as many steps as the baseline has
  after it. Every run has the same train.steps, so the learning-rate schedule is the same.

Costs are wall seconds, start-up included; a run's cost is estimated before it starts from
the baseline run's start-up and step time, scaled by the predicted step ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from neoxlab.engines.builtin import checkpoints
from neoxlab.files import REPO_ROOT
from neoxlab.run import rundir

RUNS = "runs"  # under the tune run dir
QUIET = ["logger.wandb=disabled", "logger.progress=false"]


@dataclass
class Run:
    name: str
    run_dir: Path | None
    wall_s: float
    records: list[dict] = field(default_factory=list)
    error: str = ""

    @property
    def losses(self) -> dict[int, float]:
        return {int(r["step"]): float(r["loss"]) for r in self.records
                if r.get("loss") is not None}

    @property
    def step_s(self) -> float:
        times = [r["iteration_s"] for r in self.records]
        return statistics.median(times) if times else 0.0

    @property
    def startup_s(self) -> float:
        """Wall time not spent in steps: launch, imports, set-up, checkpoints, teardown."""
        return max(self.wall_s - sum(r["iteration_s"] for r in self.records), 0.0)

    def comm_totals(self) -> dict[str, dict]:
        summary = self.run_dir / "summary.json" if self.run_dir else None
        if summary is None or not summary.exists():
            return {}
        return rundir.read_json(summary).get("comm", {})


@dataclass
class Budget:
    """The probes' cap (a share of the guarded run) and what they spent."""

    cap_s: float
    spent_s: float = 0.0

    def fits(self, estimate_s: float) -> bool:
        return self.spent_s + estimate_s <= self.cap_s

    def spend(self, seconds: float) -> None:
        self.spent_s += seconds


class Runner:
    def __init__(self, experiment: str, overrides: list[str], tune_dir: Path, timeout_s: int):
        self.experiment = experiment
        self.overrides = overrides  # the user's, as given to task=tune
        self.root = tune_dir / RUNS
        self.timeout_s = timeout_s

    def train(self, name: str, extra: list[str]) -> Run:
        """A run from scratch."""
        start = time.perf_counter()
        error = self._neoxlab(name, [*self._args(name), *extra])
        return self._finish(name, self._newest(name), time.perf_counter() - start, error)

    def from_checkpoint(self, name: str, checkpoint: Path, extra: list[str]) -> Run:
        """A run planned, given the shared checkpoint, then resumed from it."""
        start = time.perf_counter()
        error = self._neoxlab(name, [*self._args(name), *extra, "launch.submit=false"])
        run_dir = self._newest(name)
        if not error and run_dir is not None:
            link_tree(checkpoint, checkpoints.root(run_dir) / checkpoint.name)
            error = self._neoxlab(name, ["resume", str(run_dir)])
        return self._finish(name, run_dir, time.perf_counter() - start, error)

    def _args(self, name: str) -> list[str]:
        return [f"experiment={self.experiment}", *self.overrides, "task=train", *QUIET,
                "launch.submit=true", f"launch.results_dir={self.root / name}"]

    def _neoxlab(self, name: str, args: list[str]) -> str:
        """Run `python -m neoxlab <args>`, its output appended to runs/<name>.log; the
        error ('' on success)."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        with log.open("a") as out:
            out.write("$ python -m neoxlab " + " ".join(args) + "\n")
            out.flush()
            try:
                proc = subprocess.run([sys.executable, "-m", "neoxlab", *args], cwd=REPO_ROOT,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      timeout=self.timeout_s, env=_environment())
            except subprocess.TimeoutExpired:
                return f"timed out after {self.timeout_s} s (tune.run_timeout_s); see {log}"
        return "" if proc.returncode == 0 else f"exit code {proc.returncode}; see {log}"

    def _newest(self, name: str) -> Path | None:
        base = self.root / name / self.experiment
        found = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
        return found[-1] if found else None

    def _finish(self, name: str, run_dir: Path | None, wall_s: float, error: str) -> Run:
        records = []
        metrics = run_dir / "metrics.jsonl" if run_dir else None
        if metrics is not None and metrics.exists():
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line]
        return Run(name, run_dir, wall_s, records, error)


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO_ROOT / "src")  # the runs import this checkout, as the tuner does
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def link_tree(src: Path, dst: Path) -> None:
    """A copy of a checkpoint whose files are hard links where the file system allows (the
    runs only read it; a checkpoint's marker checks the sizes, which links keep)."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link)


def estimate_s(baseline: Run, steps: int, step_ratio: float, with_startup: bool = True) -> float:
    """A run's wall time before it starts: the baseline run's start-up and step time, the
    steps scaled by the predicted step ratio of its scheme to the baseline."""
    return (baseline.startup_s if with_startup else 0.0) + steps * baseline.step_s * step_ratio
