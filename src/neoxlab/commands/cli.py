"""The command line (`python -m neoxlab experiment=<name> [overrides]`, see __main__):
compose -> check -> plan -> launch."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from neoxlab.commands.check import check, exit_on_config_error
from neoxlab.commands.plan import plan_run
from neoxlab.commands.status import report
from neoxlab.config import Config, ConfigError
from neoxlab.config.compose import compose_experiment, list_experiments
from neoxlab.engines.registry import engine_of
from neoxlab.launch.manifest import record_job
from neoxlab.launch.schedulers import scheduler_of
from neoxlab.launch.submit import submit_from_login
from neoxlab.layout import Layout
from neoxlab.results import figures, tables
from neoxlab.results.compare import format_table, member_row
from neoxlab.tasks import TASKS

DEFAULT_EXPERIMENT = "local_compare"
HELP_FLAGS = frozenset({"-h", "--help"})
USAGE = f"""\
usage: python -m neoxlab [experiment=<name>] [key=value ...]
       python -m neoxlab --list
       python -m neoxlab resume <run_dir>

Runs an experiment (experiments/<name>.yaml; default {DEFAULT_EXPERIMENT}): compose its config
with the Hydra overrides given (key=value; +key=value adds a key), check it, plan a run dir
under results/<experiment>/ and launch it here or submit it to the cluster's scheduler.
  --list             the experiments' names
  resume <run_dir>   continue a stopped local training run from its last checkpoint

examples:
  python -m neoxlab                                  (the default experiment)
  python -m neoxlab experiment=local_3d train.steps=20
  python -m neoxlab experiment=baseline_192gpu launch.submit=false   (render the job only)
  python -m neoxlab resume results/local_3d/<run_id>
make run EXP=<name> [key=value ...] runs the same; `make help` lists experiments and targets."""


def split_args(args: list[str]) -> tuple[str, list[str]]:
    """Pull `experiment=<name>` out of the Hydra overrides."""
    name, rest = DEFAULT_EXPERIMENT, []
    for arg in args:
        if arg.startswith("experiment="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return name, rest


def check_scheduler(cfg: Config) -> None:
    """Refuse before planning when the job cannot be started or submitted from this machine
    (e.g. namespaces need root; this machine's own Slurm is down; no bsub here)."""
    scheduler = scheduler_of(cfg)
    if not scheduler.runs_here and not cfg.launch.submit:
        return  # the job script is only rendered
    problems = scheduler.problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    if scheduler.runs_here:
        return
    command = scheduler.submit_command
    if shutil.which(command) is None:
        raise ConfigError(
            f"cluster '{cfg.cluster.name}' submits with {command} ({cfg.cluster.scheduler}), "
            "which is not on this machine; run from the cluster's login node, or add "
            "launch.submit=false to render the job script only"
        )
    problems = engine_of(cfg).submit_checks(cfg)
    if problems:
        raise ConfigError("; ".join(problems))


def members_of(cfg: Config, overrides: list[str]) -> list[tuple[Config, Layout]]:
    """A comparison's members (`runs: [...]`), or the experiment itself, every one checked
    (and its submission possible) before any of them starts, with its checked layout."""
    if not cfg.runs:
        members = [cfg]
    else:
        task = TASKS.get(cfg.task.name)
        extra = list(task.member_overrides) if task is not None else []
        members = [compose_experiment(name, [*overrides, *extra]) for name in cfg.runs]
    checked = []
    for member in members:
        checked.append((member, check(member)))
        if TASKS[member.task.name].run is None:  # it launches: can this machine submit?
            check_scheduler(member)
    return checked


def run_comparison(cfg: Config, members: list[tuple[Config, Layout]], overrides: list[str],
                   argv: list[str]) -> int:
    """Run the (checked) members in order, then one table and the figures."""
    rows, worst = [], 0
    ran_here = all(runs_here(member) for member, _ in members)
    for member, layout in members:
        print(f"[neoxlab] === {member.experiment} ===", flush=True)
        code, run_dir = run_one(member, layout, argv, overrides)
        worst = worst or code
        if ran_here:
            rows.append(member_row(member.experiment, run_dir))
    if not ran_here:  # submitted or only planned: results come later (`make status`)
        return worst
    print(format_table(rows), flush=True)
    return worst or draw_figures(cfg)


def runs_here(cfg: Config) -> bool:
    """The job runs on this machine now, so its results exist when it returns."""
    return scheduler_of(cfg).runs_here and cfg.launch.submit


def draw_figures(cfg: Config) -> int:
    """Tables and figures of the runs just made (the newest run of each member)."""
    results = Path(cfg.launch.results_dir)
    tables.collect(cfg.experiment, results, latest=True)
    code = figures.main(["--exp", cfg.experiment, "--results", str(results)])
    print(f"[neoxlab] figures: {results}/figures/{cfg.experiment}.*.png|pdf, "
          f"table: {results}/tables/{cfg.experiment}.{TASKS[cfg.task.name].table}", flush=True)
    return code


def run_one(cfg: Config, layout: Layout, argv: list[str], overrides: list[str]
            ) -> tuple[int, Path]:
    run_dir = plan_run(cfg, layout, argv)
    print(f"[neoxlab] run dir: {run_dir}", flush=True)
    scheduler, program = scheduler_of(cfg), TASKS[cfg.task.name].program
    if not scheduler.runs_here:
        return submit_job(cfg, run_dir, overrides), run_dir
    if not cfg.launch.submit:
        print("[neoxlab] launch.submit=false: validated and planned, nothing started", flush=True)
        return 0, run_dir
    record_job(run_dir, cfg, None, overrides=overrides)
    code = scheduler.launch(cfg, run_dir, program)
    report(run_dir)
    return code, run_dir


def submit_job(cfg: Config, run_dir: Path, overrides: list[str]) -> int:
    """Render the job script into the run dir; submit it unless launch.submit=false."""
    script = scheduler_of(cfg).write_script(cfg, run_dir, TASKS[cfg.task.name].program)
    print(f"[neoxlab] job script: {script}", flush=True)
    if not cfg.launch.submit:
        print("[neoxlab] launch.submit=false: job script rendered, nothing submitted",
              flush=True)
        return 0
    return submit_from_login(cfg, run_dir, "submitted", "submission failed: {exc}",
                             overrides=overrides)


def run(args: list[str]) -> int:
    name, overrides = split_args(args)
    cfg = compose_experiment(name, overrides)
    argv = ["python", "-m", "neoxlab", *args]
    members = members_of(cfg, overrides)
    task = TASKS[cfg.task.name]
    if task.run is not None:  # e.g. predict: the performance model instead of a launch
        return task.run(cfg, [member for member, _ in members], argv)
    if cfg.runs:
        return run_comparison(cfg, members, overrides, argv)
    code, _ = run_one(cfg, members[0][1], argv, overrides)
    if code == 0 and runs_here(cfg) and task.draws_each_run:
        return draw_figures(cfg)  # e.g. a serve run is the whole experiment: draw it now
    return code


def wants_help(args: list[str]) -> bool:
    """-h/--help anywhere: Hydra's override parser would otherwise reject it as a bad key."""
    return any(arg in HELP_FLAGS for arg in args)


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if wants_help(args):
        print(USAGE)
        return 0
    if args in (["--list"], ["list"]):
        print("\n".join(list_experiments()))
        return 0
    return exit_on_config_error(lambda: run(args))
