"""A real multi-node Slurm on an emulated cluster: one slurmd per node namespace, each with its
own node name and address, under one slurmctld of its own.

The controller and srun run in a namespace of their own on the switch (`<prefix>-ctl`,
10.<subnet>.255.254); each node namespace gets an address on its bridge (10.<subnet>.<K>.254)
for its slurmd. So slurmd, srun and the job step talk over the emulated network: control
traffic from a node crosses its shaped uplink, as on a real cluster. Nothing is added to the
machine's own namespace (an interface there would also change what other jobs' MPI sees).
The daemons and srun enter only a network namespace (nsenter --net): `ip netns exec` would
mount a fresh /sys without the cgroup hierarchy slurmd needs.

Nothing here touches the machine's own Slurm (.ci/slurm-up): its own configuration, ports,
state and pid files live in STATE_ROOT/<prefix>-slurm and the run's log directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from neoxlab.launch.emulated.cluster import NetemError, run_command
from neoxlab.launch.emulated.topology import BRIDGE, Topology

STATE_ROOT = Path("/run/neoxlab")
CTL_IF, CTL_PORT = "eth0", "ctl"  # the controller's link: its end, and the switch's port
SLURMD_PORT = 6818  # in each node's own namespace: no clash with the machine's slurmd
START_TIMEOUT_S = 60
NEEDS = ("slurmctld", "slurmd", "srun", "sinfo", "scancel", "nsenter", "munge", "unmunge")
FIX = ("run `make slurm-up` (as root: installs slurm-wlm and munge, starts munged), or start "
       "the ranks with MPICH's hydra instead: cluster.launcher=mpiexec")


def controller_addr(topo: Topology) -> str:
    return f"10.{topo.subnet}.255.254"


def node_addr(topo: Topology, node: int) -> str:
    return f"10.{topo.subnet}.{node}.254"


def controller_port(topo: Topology) -> int:
    """Away from the machine's own Slurm (6817), should it share a namespace one day."""
    return 20000 + topo.subnet


def in_netns(namespace: str, cmd: list[str]) -> list[str]:
    """A command run in a network namespace only (no fresh /sys, unlike `ip netns exec`)."""
    return ["nsenter", f"--net=/run/netns/{namespace}", *cmd]


def in_controller_ns(topo: Topology, cmd: list[str]) -> list[str]:
    """A command run in the controller's namespace (srun, sinfo, slurmctld)."""
    return in_netns(topo.ctl_ns, cmd)


def state_dir(topo: Topology) -> Path:
    return STATE_ROOT / f"{topo.prefix}-slurm"


def conf_path(topo: Topology) -> Path:
    return state_dir(topo) / "slurm.conf"


def environment(topo: Topology) -> dict[str, str]:
    """What srun and the Slurm commands need to find this cluster's controller."""
    return {"SLURM_CONF": str(conf_path(topo))}


def problems(topo: Topology) -> list[str]:
    """Why this cluster cannot run Slurm, with the fix; empty when it can."""
    found = []
    missing = [name for name in NEEDS if shutil.which(name) is None]
    if missing:
        found.append(f"a multi-node Slurm on the emulated cluster needs {', '.join(missing)}, "
                     f"which {'is' if len(missing) == 1 else 'are'} missing: {FIX}")
    elif not munge_works():
        found.append(f"a multi-node Slurm on the emulated cluster authenticates with munge, "
                     f"and munged does not answer (munge -n | unmunge): {FIX}")
    if topo.ranks_per_node > 253:
        found.append(f"cluster.ranks_per_node={topo.ranks_per_node}: with cluster.launcher=srun "
                     "at most 253 (10.<subnet>.<node>.254 is the node's slurmd)")
    return found


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        back = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return cred.returncode == 0 and back.returncode == 0


def control_plane_commands(topo: Topology) -> list[list[str]]:
    """The controller's namespace on the switch and an address on every node's bridge."""
    ctl, sw = topo.ctl_ns, topo.switch_ns
    cmds = [
        ["ip", "netns", "add", ctl],
        ["ip", "-n", ctl, "link", "set", "dev", "lo", "up"],
        ["ip", "-n", ctl, "link", "add", CTL_IF, "type", "veth", "peer", "name", CTL_PORT,
         "netns", sw],
        ["ip", "-n", sw, "link", "set", "dev", CTL_PORT, "master", BRIDGE, "up"],
        ["ip", "-n", ctl, "addr", "add", f"{controller_addr(topo)}/16", "dev", CTL_IF],
        ["ip", "-n", ctl, "link", "set", "dev", CTL_IF, "up"],
    ]
    cmds += [["ip", "-n", topo.node_ns(k), "addr", "add", f"{node_addr(topo, k)}/16", "dev",
              BRIDGE] for k in range(topo.nodes)]
    return cmds


def render_conf(topo: Topology, log_dir: Path, hostname: str) -> str:
    """slurm.conf: the nodes n0..n<K-1> at their bridge addresses, one partition, the
    container-friendly plugins of .ci/slurm-up (no cgroups, no accounting)."""
    state = state_dir(topo)
    nodes = [topo.node_host(k) for k in range(topo.nodes)]
    lines = [
        f"# neoxlab emulated cluster '{topo.prefix}': one slurmd per node namespace",
        f"ClusterName={topo.prefix}",
        f"SlurmctldHost={hostname}({controller_addr(topo)})",
        f"SlurmctldPort={controller_port(topo)}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        f"StateSaveLocation={state}/ctld",
        f"SlurmdSpoolDir={state}/%n",
        f"SlurmctldPidFile={state}/slurmctld.pid",
        f"SlurmdPidFile={state}/slurmd.%n.pid",
        f"SlurmctldLogFile={log_dir}/slurmctld.log",
        f"SlurmdLogFile={log_dir}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=pmi2",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",  # more CPUs than the machine has: oversubscribed
        "ReturnToService=2",
        "KillWait=5",
        "InactiveLimit=0",
        "SchedulerParameters=sched_interval=5",
    ]
    lines += [f"NodeName={name} NodeAddr={node_addr(topo, k)} CPUs={topo.ranks_per_node} "
              "State=UNKNOWN" for k, name in enumerate(nodes)]
    lines.append(f"PartitionName=emulated Nodes={','.join(nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _pids(topo: Topology) -> list[int]:
    found = []
    for path in state_dir(topo).glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            found.append(int(path.read_text().split()[0]))
    return found


def _clients(topo: Topology) -> list[int]:
    """Processes started with this cluster's SLURM_CONF (a killed launcher's srun)."""
    mark = f"SLURM_CONF={conf_path(topo)}\0".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if mark in environ.read_bytes() and int(environ.parent.name) != os.getpid():
                found.append(int(environ.parent.name))
    return found


def stop(topo: Topology) -> None:
    """Kill this cluster's daemons and clients (also a killed run's), forget its state."""
    for pid in _pids(topo) + _clients(topo):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(state_dir(topo), ignore_errors=True)


def start(topo: Topology, log_dir: Path) -> None:
    """Controller and one slurmd per node namespace, then wait until every node is idle."""
    stop(topo)
    state = state_dir(topo)
    for sub in ("ctld", *(topo.node_host(k) for k in range(topo.nodes))):
        (state / sub).mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    conf = conf_path(topo)
    conf.write_text(render_conf(topo, log_dir, socket.gethostname().split(".")[0]))
    for cmd in control_plane_commands(topo):
        run_command(cmd)
    env = {**os.environ, **environment(topo)}
    _daemon(in_controller_ns(topo, ["slurmctld", "-f", str(conf)]), env,
            log_dir / "slurmctld.log")
    for k in range(topo.nodes):
        _daemon(in_netns(topo.node_ns(k), ["slurmd", "-f", str(conf), "-N", topo.node_host(k)]),
                env, log_dir / f"slurmd.{topo.node_host(k)}.log")
    _wait_idle(topo, env, log_dir)


def _daemon(cmd: list[str], env: dict[str, str], log: Path) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise NetemError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()}{_tail(log)}")


def cancel_jobs(topo: Topology, env: dict[str, str], log_dir: Path) -> None:
    """End every job of this cluster and wait until its nodes are idle: a killed srun
    leaves its job, and its ranks on the nodes, holding them."""
    subprocess.run(in_controller_ns(topo, ["scancel", f"--user={os.getuid()}"]), env=env,
                   capture_output=True, text=True, timeout=30, check=False)
    _wait_idle(topo, env, log_dir)


def _wait_idle(topo: Topology, env: dict[str, str], log_dir: Path) -> None:
    deadline, states = time.monotonic() + START_TIMEOUT_S, ""
    while time.monotonic() < deadline:
        out = subprocess.run(in_controller_ns(topo, ["sinfo", "-h", "-N", "-o", "%N %t"]),
                             env=env, capture_output=True, text=True, timeout=10, check=False)
        states = out.stdout.strip()
        rows = [line.split() for line in states.splitlines()]
        if len(rows) == topo.nodes and all(state == "idle" for _, state in rows):
            return
        time.sleep(0.5)
    raise NetemError(f"the emulated Slurm's nodes are not idle after {START_TIMEOUT_S} s "
                     f"(sinfo: {states or 'no answer'}){_tail(log_dir / 'slurmctld.log')}")


def _tail(log: Path, lines: int = 8) -> str:
    if not log.exists():
        return ""
    return f"; last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-lines:])


@contextlib.contextmanager
def running(topo: Topology, log_dir: Path) -> Iterator[dict[str, str]]:
    """The Slurm of a running emulated cluster for a block; the environment its commands need.
    Stopped on exit, error and Ctrl-C (the namespaces' teardown also kills its slurmds)."""
    try:
        start(topo, log_dir)
        yield environment(topo)
    finally:
        stop(topo)
