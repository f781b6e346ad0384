"""Run a job on an emulated cluster (cluster.emulated): build the namespaces, start the ranks
across the emulated nodes, record what the uplinks carried, tear down.

Two ways to start the ranks (cluster.launcher):
- srun: a real multi-node Slurm on the emulated nodes (slurm.py: one slurmd per node
  namespace under a controller of its own); srun places the ranks on the nodes, and each
  enters its own namespace from its node's (netns_rank.sh beside this file).
- mpiexec: MPICH's hydra, whose ssh launcher is netns_proxy.sh beside this file: one proxy per
  emulated node on this machine, whose ranks enter their namespaces the same way.
Gloo then talks over the ranks' `eth0` (GLOO_SOCKET_IFNAME) and rank 0's emulated address, so
every byte between nodes crosses the shaped uplinks.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from neoxlab.config import Config, ConfigError
from neoxlab.launch import local, pmi_relay, shm
from neoxlab.launch.emulated import cluster, slurm
from neoxlab.launch.emulated.topology import RANK_IF, Topology
from neoxlab.launch.emulated.topology import problems as topology_problems
from neoxlab.launch.failure import STARTUP_FAILED
from neoxlab.layout import world_size
from neoxlab.run import rundir
from neoxlab.run.rankjob import RankProgram

PROXY = Path(__file__).with_name("netns_proxy.sh")
RANK = Path(__file__).with_name("netns_rank.sh")
# a job step whose ranks could not start (Slurm's pmi2 flaw, launch.failure.FATAL_STARTUP)
# is started again this many times in all: nothing ran, so nothing is lost or repeated
STARTS = 3
LAUNCHERS = {  # cluster.launcher -> what starts the ranks across the emulated nodes
    "srun": "a multi-node Slurm on the emulated nodes",
    "mpiexec": "MPICH hydra across them",
}


def topology(cfg: Config) -> Topology:
    return Topology.from_config(cfg.cluster.emulated, cfg.cluster.nodes,
                                cfg.cluster.ranks_per_node)


def problems(cfg: Config) -> list[str]:
    """Why the job cannot start, before anything is planned: a layout that does not fill the
    cluster, bad link values, or a machine where namespaces cannot be made (with the fix)."""
    found = topology_problems(cfg.cluster.emulated, cfg.cluster.nodes,
                              cfg.cluster.ranks_per_node, world_size(cfg))
    if cfg.launch.submit and (missing := cluster.prerequisite_problem()):
        found.append(missing)
    if cfg.launch.submit and cfg.cluster.launcher == "srun":
        found += slurm.problems(topology(cfg))
    return found


def preflight(cfg: Config) -> None:
    """problems() as one ConfigError (the launch checks again: the machine may have changed)."""
    found = problems(cfg)
    if found:
        raise ConfigError("; ".join(found))


def mpiexec_command(cfg: Config, run_dir: Path, topo: Topology, program: RankProgram,
                    server: str | None) -> list[str]:
    """Ranks (or their fork-server stubs, which the forked ranks follow into the namespace)
    started in their emulated nodes' namespaces."""
    hosts = ",".join(f"{topo.node_host(k)}:{topo.ranks_per_node}" for k in range(topo.nodes))
    return [local.mpiexec_path(), "-launcher", "ssh", "-launcher-exec", str(PROXY),
            "-hosts", hosts, "-n", str(world_size(cfg)),
            "sh", str(RANK), topo.prefix, *local.rank_program(cfg, run_dir, program, server)]


def srun_command(cfg: Config, run_dir: Path, topo: Topology, program: RankProgram,
                 server: str | None) -> list[str]:
    """One job step across the emulated nodes' slurmds (a job of its own: srun allocates),
    srun in the controller's namespace; each rank behind a PMI relay, as Slurm 22.05's pmi2
    plugin misreads MPICH's longest PMI-1 lines (launch/pmi_relay.py)."""
    return slurm.in_controller_ns(topo, [
        "srun", f"--job-name={cfg.experiment}", f"--nodes={topo.nodes}",
        f"--ntasks-per-node={topo.ranks_per_node}", f"--ntasks={world_size(cfg)}",
        f"--mpi={cfg.cluster.mpi}", "--kill-on-bad-exit=1",
        "sh", str(RANK), topo.prefix,
        *pmi_relay.command(local.rank_program(cfg, run_dir, program, server))])


def environment(cfg: Config, run_dir: Path) -> dict[str, str]:
    env = local.rank_environment(cfg, run_dir)
    env["GLOO_SOCKET_IFNAME"] = RANK_IF  # gloo's traffic goes over the emulated links
    env.pop("MASTER_ADDR", None)  # rank 0's emulated address, found by neoxlab.run.dist
    return env


def launch(cfg: Config, run_dir: Path, program: RankProgram) -> int:
    """The job on a freshly built cluster; the cluster goes away afterwards, also on failure
    and Ctrl-C. network.json in the run dir records the links and what each uplink carried."""
    preflight(cfg)
    topo = topology(cfg)
    env = environment(cfg, run_dir)
    segments_before = shm.segments()
    try:
        return _launch(cfg, run_dir, program, topo, env)
    finally:
        # srun's ranks are slurmstepd's children, not the launcher's: they can outlive its
        # own clean-up and die only with the cluster. A segment they leave blocks the next
        # run's MPI start-up ("Out of memory" in MPI_Init): every run's Slurm numbers its job
        # 1, and MPICH names the segment after the job.
        shm.remove_stale(segments_before, wait_s=10)


def _launch(cfg: Config, run_dir: Path, program: RankProgram, topo: Topology,
            env: dict[str, str]) -> int:
    with cluster.running(topo, keep=cfg.cluster.emulated.keep), contextlib.ExitStack() as stack:
        command = mpiexec_command
        if cfg.cluster.launcher == "srun":
            env.update(stack.enter_context(slurm.running(topo, run_dir / "logs" / "slurm")))
            command = srun_command
            shm.remove_abandoned()  # a killed run's ranks (set-up ended them) left theirs
        before = cluster.uplink_counters(topo)
        for _ in range(STARTS):
            code = local.launch(cfg, run_dir, program,
                                lambda server: command(cfg, run_dir, topo, program, server), env)
            if code == 0 or not never_started(run_dir):
                break
            print(f"[neoxlab] the ranks could not start ({STARTUP_FAILED}, see "
                  f"{run_dir / 'logs' / 'launcher.log'}): starting them again", flush=True)
            if cfg.cluster.launcher == "srun":  # the killed srun's job still holds the nodes
                slurm.cancel_jobs(topo, env, run_dir / "logs" / "slurm")
        after = cluster.uplink_counters(topo)
        down = cluster.down_links(topo)
        record_network(run_dir, topo, before, after, down)
        if code != 0 and down:
            add_network_cause(run_dir, down)
    return code


def never_started(run_dir: Path) -> bool:
    """The last attempt failed before any rank got past MPI start-up."""
    error = rundir.read_json(run_dir / "status.json").get("error") or ""
    return error.startswith(STARTUP_FAILED)


def record_network(run_dir: Path, topo: Topology, before: dict, after: dict,
                   down: list[str]) -> None:
    carried = {node: {key: after[node][key] - before[node][key] for key in after[node]}
               for node in after}
    rundir.write_json(run_dir / "network.json", {
        "nodes": topo.nodes, "ranks_per_node": topo.ranks_per_node,
        "ranks": [vars(s) for s in topo.slots()],
        "intra": vars(topo.intra), "inter": vars(topo.inter),
        "uplinks": carried,  # per node, its side of the uplink: tx left the node, rx came in
        "links_down": down,
    })


def add_network_cause(run_dir: Path, down: list[str]) -> None:
    """A failed job on a cut network: the ranks only see timeouts; say which link it was."""
    status = rundir.read_json(run_dir / "status.json")
    error = f"{status.get('error')}; network: {'; '.join(down)}"
    rundir.set_status(run_dir, "failed", error=error)
