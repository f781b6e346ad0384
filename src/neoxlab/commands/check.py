"""The one place every rule runs: layout, cluster, compression, checkpointing, engine, task.

Each rule lives beside the code it protects and returns its violations as text (value, rule,
fix); check() gathers them all, so a bad experiment is refused in one round, before any run
dir, job or rank exists. It sits above every rule module (nothing below imports it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from neoxlab import layout
from neoxlab.comm.compression_rules import validate_compression, validate_online_engine
from neoxlab.comm.group_backends import validate_group_backends
from neoxlab.config import Config, ConfigError
from neoxlab.engines.builtin.train_rules import validate_checkpointing
from neoxlab.engines.registry import engine_of, unknown_engine
from neoxlab.files import disk_full
from neoxlab.launch.cluster_rules import validate_cluster
from neoxlab.launch.schedulers import SCHEDULERS, scheduler_of
from neoxlab.tasks import TASKS


def problems(cfg: Config) -> list[str]:
    """Every violated rule; empty when the experiment can run."""
    errors = layout.basic_errors(cfg) + unknown_engine(cfg)
    errors += [p for p in (TASKS.problem(cfg.task.name),
                           SCHEDULERS.problem(cfg.cluster.scheduler)) if p]
    if errors:  # the rules below need positive sizes and a known task, engine and scheduler
        return errors
    world = layout.world_size(cfg)
    task, engine = TASKS[cfg.task.name], engine_of(cfg)
    errors = layout.validate(cfg)
    errors += validate_checkpointing(cfg, world)
    errors += validate_compression(cfg, task.trains)
    errors += validate_group_backends(cfg.engine.group_backends, engine.routes_groups)
    errors += validate_online_engine(cfg, engine.rechecks_compression)
    errors += task.rules(cfg, world)
    errors += validate_cluster(cfg)
    errors += engine.rules(cfg, task.trains)
    if task.trains and scheduler_of(cfg).runs_here:  # on a cluster the ranks check the data
        errors += engine.data_rules(cfg)
    return errors or layout.memory_errors(cfg)


def check(cfg: Config) -> layout.Layout:
    """The layout of a runnable experiment; ConfigError listing every problem otherwise."""
    errors = problems(cfg)
    if errors:
        raise ConfigError(layout.format_errors(cfg.experiment, errors))
    return layout.resolve_layout(cfg)


def exit_on_config_error(main: Callable[[], int]) -> int:
    """Run an entry point; a ConfigError becomes one `[neoxlab] error` line and exit code 2,
    a full disk one line naming the folder and its free space, exit code 1 (no traceback)."""
    try:
        return main()
    except ConfigError as exc:
        print(f"[neoxlab] error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        line = disk_full(exc)
        if line is None:
            raise
        print(f"\n[neoxlab] error: {line}", file=sys.stderr)  # after a progress bar's line
        return 1
