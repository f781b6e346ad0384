"""The task registry: everything `task.name` selects, in one table.

A task is its config rules, an optional hook that writes task files into a new run dir, the
module every rank runs (`python -m <module> <run_dir>`, built on run.rankjob.run_rank) or,
for a task that launches nothing, a `run` hook, the table printed after a local run, whether
it trains, whether a run of it alone is drawn at once, and the folder under
launch.results_dir it writes instead of run dirs. Nothing outside this record compares a
task's name. Adding a task: one module with its rank program, one line in TASKS (see
ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neoxlab.config import Config, ConfigError
from neoxlab.engines.registry import engine_of
from neoxlab.layout import Layout
from neoxlab.omb import task as omb
from neoxlab.registry import Registry
from neoxlab.run.rankjob import RankProgram
from neoxlab.serve.rules import validate_serve
from neoxlab.tasks import predict
from neoxlab.tune import online as tune_online
from neoxlab.tune import task as tune

Rules = Callable[[Config, int], list[str]]  # (config, world size) -> every violated rule


@dataclass(frozen=True)
class Task:
    rules: Rules
    rank_module: str | None = None  # per-rank program (builtin engine); None: nothing launched
    plan: Callable[[Config, Layout, Path], None] | None = None  # extra files in the run dir
    # a task that launches nothing: run(cfg, members checked, argv) -> exit code
    run: Callable[[Config, list[Config], list[str]], int] | None = None
    member_overrides: tuple[str, ...] = ()  # added when composing a comparison's members
    table: str = "summary.md"  # results/tables/<exp>.<table>, printed after a local run
    # imported once by the local fork server before it forks the ranks (forkserver/server.py)
    warm_imports: tuple[str, ...] = ()
    trains: bool = False  # its ranks train a model (checkpoints, compression=auto, engine=neox)
    draws_each_run: bool = False  # a run of it alone is the whole experiment: drawn at once
    # its own folder under launch.results_dir (not an experiment's run dirs; tables skip it)
    output_dir: str | None = None

    @property
    def program(self) -> RankProgram | None:
        """What the launcher starts on every rank; None for a task that launches nothing."""
        if self.rank_module is None:
            return None
        return RankProgram(self.rank_module, self.warm_imports)


def _no_rules(cfg: Config, world: int) -> list[str]:
    return []


def _serve_rules(cfg: Config, world: int) -> list[str]:
    return validate_serve(cfg, trains=_trains)


def _trains(name: str) -> bool:
    """Whether task `name` trains (a run dir's task, for serve.weights=run:<dir>)."""
    task = TASKS.get(name)
    return task is not None and task.trains


def _engine_files(cfg: Config, layout: Layout, run_dir: Path) -> None:
    """The engine's own config: DeepSpeed's JSON (builtin) or GPT-NeoX's YAML (neox); with
    compression=auto, the model's plan the ranks re-check against (tune/online.py)."""
    engine_of(cfg).files(cfg, layout, run_dir)
    if cfg.compression.scheme != "auto":
        return
    try:
        tune_online.write_plan(cfg, layout, run_dir)
    except ConfigError as exc:
        if cfg.launch.submit:
            raise
        print(f"[neoxlab] compression=auto: no plan priced ({exc}); launch.submit=false, "
              "so nothing runs without it", flush=True)


TASKS: Registry[Task] = Registry("task.name", "neoxlab/tasks/__init__.py", {
    "train": Task(rules=_no_rules, rank_module="neoxlab.engines.builtin", plan=_engine_files,
                  warm_imports=("neoxlab.engines.builtin.program",
                                "neoxlab.engines.builtin.model.pipe", "deepspeed"),
                  trains=True),
    "serve": Task(rules=_serve_rules, rank_module="neoxlab.serve", table="serve.csv",
                  warm_imports=("neoxlab.serve.program",), draws_each_run=True),
    "omb": Task(rules=omb.rules, rank_module="neoxlab.omb.task"),
    "predict": Task(rules=_no_rules, run=predict.run_predict,
                    member_overrides=("task=predict",), output_dir=predict.PREDICTIONS_DIR),
    "tune": Task(rules=tune.rules, run=tune.run_tune, table="tune.md", output_dir=tune.TUNE_DIR),
})
