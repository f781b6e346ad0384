"""The engine registry: everything `engine.name` selects, in one table.

An engine is what runs the training ranks. Check, plan, launch, resume, serve and the
performance model ask its record for what they need and never compare its name: its rules,
its config files in a new run dir, each rank's command and environment, what to do after a
job, and the facts that differ between engines. Adding an engine: a package beside builtin/
and neox/ with those functions, and one entry in ENGINES (see ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from neoxlab.config import Config
from neoxlab.engines.builtin import checkpoints
from neoxlab.engines.builtin import launch as builtin_launch
from neoxlab.engines.builtin.deepspeed_config import render as render_deepspeed
from neoxlab.engines.builtin.deepspeed_config import wire_dtypes as deepspeed_wire_dtypes
from neoxlab.engines.builtin.train_rules import validate_data
from neoxlab.engines.neox import launch as neox_launch
from neoxlab.engines.neox.metrics import collect_metrics
from neoxlab.engines.neox.render import wire_dtypes as neox_wire_dtypes
from neoxlab.engines.neox.render import write_neox_yml
from neoxlab.engines.neox.rules import check_local_checkout, check_neox_inputs, validate_neox
from neoxlab.engines.neox.stop import resume_step as neox_resume_step
from neoxlab.engines.neox.traffic import messages as neox_messages
from neoxlab.layout import Layout
from neoxlab.messages import Message
from neoxlab.registry import Registry
from neoxlab.run import rundir


def _nothing(cfg: Config) -> list[str]:
    return []


@dataclass(frozen=True)
class Engine:
    # its own config rules (value, rule, fix each): (config, whether the task trains)
    rules: Callable[[Config, bool], list[str]]
    files: Callable[[Config, Layout, Path], None]  # its config files in a new training run dir
    # argv of one rank: (config, run dir, python, the task's rank module)
    rank_command: Callable[[Config, Path, str, str], list[str]]
    rank_env: Callable[[Config, Path], dict[str, str]]  # variables every rank needs
    submit_checks: Callable[[Config], list[str]] = _nothing  # files checked before a submit
    # a training run's data, checked here when its ranks run on this machine
    data_rules: Callable[[Config], list[str]] = _nothing
    after_job: Callable[[Path], object] | None = None  # e.g. rank logs -> metrics.jsonl
    steps_in_logs: bool = False  # its rank logs hold the steps (results read them if needed)
    forkable: bool = False  # local ranks may be forked from the fork server
    checkpoints: bool = False  # its training runs keep neoxlab checkpoints (resume, serve)
    routes_groups: bool = False  # builds its groups through comm.group_backends.GroupRouter
    reduces_to_owners: bool = False  # honours zero.reduce_to_owner (neoxlab's ZeRO hook)
    # its training loop re-checks links and switches codecs (compression=auto)
    rechecks_compression: bool = False
    # GPT-NeoX's parallel residual reduces attention and MLP in one TP all-reduce per layer
    fused_parallel_residual: bool = False
    # the step a resumed run would continue after (its newest usable checkpoint in the run
    # dir, None: none yet); None here: its runs cannot be resumed (`make resume`)
    resume_step: Callable[[Path], int | None] | None = None
    # the dtype each dimension's payloads travel in (tp, pp, dp, zero -> fp32 | fp16 | bf16),
    # from the engine's files as rendered (the performance model's bytes and codec ratios)
    wire_dtypes: Callable[[Config], dict[str, str]] = deepspeed_wire_dtypes
    # its own TP and pipeline messages of one step (config, layout, each dimension's wire
    # bits), per pipeline stage; None: the performance model's counts for megatron-core
    # layers in DeepSpeed's pipeline (perfmodel/traffic.py)
    traffic: Callable[[Config, Layout, Mapping[str, int]], list[Message]] | None = None


def _builtin_rules(cfg: Config, trains: bool) -> list[str]:
    return []


def _deepspeed_json(cfg: Config, layout: Layout, run_dir: Path) -> None:
    rundir.write_json(run_dir / "deepspeed.json", render_deepspeed(cfg, layout))


def _neox_command(cfg: Config, run_dir: Path, python: str, task_module: str) -> list[str]:
    return neox_launch.rank_command(cfg, run_dir, python)  # its entry runs train.py itself


def _builtin_resume_step(run_dir: Path) -> int | None:
    good = checkpoints.usable(checkpoints.scan(run_dir))
    return good[0].step if good else None


ENGINES: Registry[Engine] = Registry("engine.name", "neoxlab/engines/registry.py", {
    "builtin": Engine(rules=_builtin_rules, files=_deepspeed_json,
                      rank_command=builtin_launch.rank_command, rank_env=builtin_launch.rank_env,
                      forkable=True, checkpoints=True, routes_groups=True, reduces_to_owners=True,
                      rechecks_compression=True, data_rules=validate_data,
                      resume_step=_builtin_resume_step, wire_dtypes=deepspeed_wire_dtypes),
    "neox": Engine(rules=validate_neox, files=write_neox_yml, rank_command=_neox_command,
                   rank_env=neox_launch.rank_env, submit_checks=check_neox_inputs,
                   data_rules=check_local_checkout, after_job=collect_metrics,
                   steps_in_logs=True, fused_parallel_residual=True, resume_step=neox_resume_step,
                   wire_dtypes=neox_wire_dtypes, traffic=neox_messages),
})


def unknown_engine(cfg: Config) -> list[str]:
    """The engine rule: `engine.name` is one of ENGINES."""
    problem = ENGINES.problem(cfg.engine.name)
    return [problem] if problem else []


def without_checkpoints(cfg: Config, trains: bool) -> str | None:
    """What kind of run it is when its dir can hold no neoxlab checkpoints (nothing for resume
    or serve to load); None when it can. `trains`: the run's task record says it trains."""
    if not trains:
        return f"a task={cfg.task.name} run"
    if not engine_of(cfg).checkpoints:
        return f"an engine={cfg.engine.name} run"
    return None


def not_resumable(cfg: Config, trains: bool) -> str | None:
    """What kind of run it is when `make resume` cannot continue it (no checkpoints its
    engine would load); None when it can. `trains`: the run's task record says it trains."""
    if not trains:
        return f"a task={cfg.task.name} run"
    if engine_of(cfg).resume_step is None:
        return f"an engine={cfg.engine.name} run"
    return None


def engine_of(cfg: Config) -> Engine:
    """The record of the config's engine; ConfigError naming the choices otherwise."""
    return ENGINES[cfg.engine.name]
