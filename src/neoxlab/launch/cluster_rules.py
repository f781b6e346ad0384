"""Cluster and launch rules, checked with the layout before anything is planned or submitted."""

from __future__ import annotations

import re

from neoxlab.config import ClusterConfig, Config, ConfigError
from neoxlab.launch.jobscript import directive_value

LAUNCHERS = {"local": "mpiexec", "lsf": "jsrun", "slurm": "srun"}
EMULATED_LAUNCHERS = ("srun", "mpiexec")  # a multi-node Slurm, or hydra (netem, launch.emulated)
RANK_STARTS = ("forkserver", "exec")
SLURM_MPI = ("pmi2", "pmix", "pmi1", "none")
LSF_WALLTIME = re.compile(r"^(\d+:)?\d+$")  # [HH:]MM
SLURM_WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$|^\d+-\d+$")  # [D-]HH[:MM[:SS]] | MM
WALLTIME_FORMS = {"lsf": "[HH:]MM, e.g. 12:00", "slurm": "[D-]HH:MM:SS or MM, e.g. 12:00:00"}


def walltime_ok(scheduler: str, walltime: str) -> bool:
    if scheduler == "lsf":
        ok = bool(LSF_WALLTIME.match(walltime))
        return ok and (":" not in walltime or int(walltime.split(":")[1]) < 60)
    return bool(SLURM_WALLTIME.match(walltime))


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
    c, errors = cfg.cluster, []
    expected = LAUNCHERS.get(c.scheduler)
    if c.emulated is not None and c.scheduler == "local":
        if c.launcher not in EMULATED_LAUNCHERS:
            errors.append(
                f"cluster.launcher='{c.launcher}' cannot start ranks on an emulated cluster; "
                "use cluster.launcher=srun (a multi-node Slurm on the emulated nodes) or "
                "cluster.launcher=mpiexec (MPICH hydra across them)")
    elif expected and c.launcher != expected:
        errors.append(
            f"cluster.launcher='{c.launcher}' does not go with scheduler '{c.scheduler}'; "
            f"use cluster.launcher={expected}"
        )
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
    if c.scheduler == "local":
        return errors
    if not walltime_ok(c.scheduler, c.walltime):
        errors.append(
            f"cluster.walltime='{c.walltime}' is not a {c.scheduler} time limit; write it as "
            f"{WALLTIME_FORMS[c.scheduler]}"
        )
    if c.scheduler == "slurm" and c.mpi not in SLURM_MPI:
        errors.append(f"cluster.mpi='{c.mpi}' is not one of {list(SLURM_MPI)} (srun --mpi)")
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
