"""Cluster and launch rules, checked with the layout before anything is planned or submitted."""

from __future__ import annotations

from neoxlab.config import ClusterConfig, Config, ConfigError
from neoxlab.launch.jobscript import directive_value
from neoxlab.launch.schedulers import SCHEDULERS, Scheduler

RANK_STARTS = ("forkserver", "exec")


def launcher_errors(c: ClusterConfig, scheduler: Scheduler) -> list[str]:
    """cluster.launcher is one its scheduler starts ranks with."""
    if c.launcher in scheduler.launchers:
        return []
    choices = " or ".join(f"cluster.launcher={name}" + (f" ({what})" if what else "")
                          for name, what in scheduler.launchers.items())
    return [f"cluster.launcher='{c.launcher}' does not go with scheduler '{c.scheduler}'; "
            f"use {choices}"]


def emulated_errors(c: ClusterConfig, scheduler: Scheduler) -> list[str]:
    """The links' settings (cluster.emulated) go with the scheduler that builds them."""
    if scheduler.emulates and c.emulated is None:
        return [f"cluster.scheduler='{c.scheduler}' emulates nodes on this machine, but cluster "
                f"'{c.name}' has no cluster.emulated links; start from cluster=emulated"]
    if not scheduler.emulates and c.emulated is not None:
        builds = [name for name, s in SCHEDULERS.items() if s.emulates]
        return [f"cluster '{c.name}' has emulated links (cluster.emulated), but scheduler "
                f"'{c.scheduler}' does not build them; use cluster.scheduler="
                f"{' or '.join(builds)} (or start from cluster=emulated)"]
    return []


def machine_size_errors(c: ClusterConfig) -> list[str]:
    """A job larger than the machine would render and only fail in the scheduler's queue (or
    never start): refuse cluster.nodes beyond the size its cluster config records."""
    if c.max_nodes is None:
        return []
    if c.max_nodes < 1:
        return [f"cluster.max_nodes={c.max_nodes} must be >= 1 (the machine's node count) or "
                "null (not known, not checked)"]
    if c.nodes <= c.max_nodes:
        return []
    asked, has = "", ""
    if c.gpus_per_node:
        asked = f" ({c.nodes * c.gpus_per_node} GPUs)"
        has = f" ({c.max_nodes * c.gpus_per_node} GPUs)"
    return [f"cluster.nodes={c.nodes}{asked} is more than {c.name} has: cluster.max_nodes="
            f"{c.max_nodes}{has}; ask for at most {c.max_nodes} nodes (lower cluster.nodes, "
            "and parallel.dp with it), or raise cluster.max_nodes if the machine grew"]


def validate_cluster(cfg: Config) -> list[str]:
    """Every violated cluster/launch rule with its value and fix; empty when launchable."""
    c = cfg.cluster
    unknown = SCHEDULERS.problem(c.scheduler)
    if unknown is not None:
        return [unknown]
    scheduler = SCHEDULERS[c.scheduler]
    errors = launcher_errors(c, scheduler) + emulated_errors(c, scheduler)
    if c.device != "cpu":
        if c.gpus_per_node < 1:
            errors.append(
                f"cluster.device='{c.device}' needs cluster.gpus_per_node >= 1 "
                f"(got {c.gpus_per_node}); set the GPUs a node has"
            )
        elif c.ranks_per_node > c.gpus_per_node:
            errors.append(
                f"cluster.ranks_per_node={c.ranks_per_node} asks for more GPUs than a "
                f"{c.name} node has (gpus_per_node={c.gpus_per_node}): "
                f"{c.nodes} nodes x {c.gpus_per_node} GPUs = {c.nodes * c.gpus_per_node} GPUs; "
                "one rank per GPU: lower ranks_per_node or raise cluster.nodes"
            )
    errors += machine_size_errors(c)
    if cfg.launch.rank_start not in RANK_STARTS:
        errors.append(f"launch.rank_start='{cfg.launch.rank_start}' is not one of "
                      f"{list(RANK_STARTS)} (forkserver: ranks forked from one pre-imported "
                      "process; exec: a fresh interpreter per rank)")
    errors += scheduler.rules(cfg)
    if scheduler.runs_here:  # no job script: no time limit, signal, requeue or directives
        return errors
    if not 0 < cfg.launch.warn_before_s <= 65535:
        errors.append(
            f"launch.warn_before_s={cfg.launch.warn_before_s} must be in 1..65535 (seconds "
            "before the time limit at which the ranks are told to checkpoint)"
        )
    if cfg.launch.requeue < 0:
        errors.append(f"launch.requeue={cfg.launch.requeue} must be >= 0 (0: never requeue)")
    for field, value in [("cluster.queue", c.queue), ("cluster.account", c.account),
                         ("launch.results_dir", cfg.launch.results_dir),
                         *[(f"cluster.extra.{k}", v) for k, v in c.extra.items()]]:
        if value is None:
            continue
        try:
            directive_value(field, value)
        except ConfigError as exc:
            errors.append(str(exc))
    return errors
