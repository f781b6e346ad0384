"""Build, inspect, change and remove an emulated cluster on this machine (needs root + `ip`).

Set-up first removes whatever an earlier run with the same prefix left behind (a killed
launcher cannot clean up), so set-up and teardown are both idempotent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from neoxlab.config.emulated import LinkConfig
from neoxlab.launch.emulated.topology import (
    RANK_IF,
    UPLINK_IF,
    Topology,
    build_commands,
    hosts_file,
    link_commands,
    loss_table,
)

NETNS_ETC = Path("/etc/netns")  # `ip netns exec <ns>` bind-mounts <dir>/<ns>/* over /etc/*
COUNTERS = ("tx_bytes", "tx_packets", "rx_bytes", "rx_packets")


class NetemError(RuntimeError):
    """The emulated cluster cannot be built or changed; the message names the fix."""


def prerequisite_problem() -> str | None:
    """Why namespaces cannot be made here, with the fix; None when they can."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return ("the emulated cluster needs the `ip` and `tc` commands, which are missing: "
                "install them with `apt-get install iproute2`")
    if os.geteuid() != 0:
        return ("the emulated cluster creates network namespaces, which needs root (uid 0); "
                "run as root (e.g. `sudo -E make run ...`) or use cluster=local")
    return None


def run_command(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise NetemError(f"`{cmd[0]}` is missing ({exc}); {_FIXES.get(cmd[0], '')}") from None
    if check and proc.returncode != 0:
        error = proc.stderr.strip() or proc.stdout.strip()
        hint = next((fix for cause, fix in _HINTS if cause in " ".join(cmd) + error), "")
        raise NetemError(f"`{' '.join(cmd)}` failed: {error}{hint}")
    return proc


_FIXES = {"ip": "install it with `apt-get install iproute2`",
          "tc": "install it with `apt-get install iproute2`"}
_HINTS = (
    ("netem delay", "; latency needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM, module "
     "sch_netem), which this kernel lacks: set cluster.emulated.intra/inter.latency_us=0 or "
     "use a kernel with netem"),
    ("nft", "; packet loss needs nftables: install it with `apt-get install nftables` (and a "
     "kernel with nf_tables netdev support)"),
)


def existing_namespaces() -> list[str]:
    out = run_command(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def teardown(topo: Topology) -> list[str]:
    """Remove every namespace of this prefix (current or stale) and what lives in it: their
    processes are killed first (a killed run's ranks), then the namespaces and hosts files."""
    removed = []
    for ns in existing_namespaces():
        if not topo.owns(ns):
            continue
        pids = run_command(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run_command(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    if NETNS_ETC.is_dir():
        for path in NETNS_ETC.iterdir():
            if topo.owns(path.name):
                shutil.rmtree(path, ignore_errors=True)
    return removed


def build(topo: Topology) -> None:
    """Create the cluster from scratch (stale leftovers of the prefix removed first); on any
    failure nothing of it stays."""
    problem = prerequisite_problem()
    if problem:
        raise NetemError(problem)
    teardown(topo)
    try:
        for cmd in build_commands(topo):
            run_command(cmd)
        machine = socket.gethostname()
        for slot in topo.slots():
            etc = NETNS_ETC / slot.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file(topo, slot, machine))
    except BaseException:
        teardown(topo)
        raise


@contextlib.contextmanager
def running(topo: Topology, keep: bool = False) -> Iterator[Topology]:
    """The cluster for the duration of a block; removed on exit, error and Ctrl-C, and on
    SIGHUP (a closed terminal), which would otherwise end the process without cleanup."""
    build(topo)
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: no signal handlers
        previous = signal.signal(signal.SIGHUP, _raise_interrupt)
    try:
        yield topo
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)
        if not keep:
            teardown(topo)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def counters(ns: str, dev: str) -> dict[str, int]:
    """Kernel byte and packet counters of an interface, read from /sys inside its namespace."""
    stats = f"/sys/class/net/{dev}/statistics"
    cmd = ["ip", "netns", "exec", ns, "cat", *(f"{stats}/{name}" for name in COUNTERS)]
    values = run_command(cmd).stdout.split()
    return dict(zip(COUNTERS, (int(v) for v in values), strict=True))


def uplink_counters(topo: Topology) -> dict[str, dict[str, int]]:
    """Per node, the node side of its uplink: tx = what left the node, rx = what came in."""
    return {topo.node_host(k): counters(topo.node_ns(k), UPLINK_IF) for k in range(topo.nodes)}


def link_state(ns: str, dev: str) -> str:
    proc = run_command(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/operstate"],
                       check=False)
    return proc.stdout.strip() or "missing"


def set_uplink(topo: Topology, node: int, up: bool) -> None:
    """Take a node's NIC down (or back up), as a pulled cable would."""
    state = "up" if up else "down"
    run_command(["ip", "-n", topo.node_ns(node), "link", "set", "dev", UPLINK_IF, state])


def reshape_uplinks(topo: Topology, link: LinkConfig) -> None:
    """New rate, latency and loss on every uplink, while the cluster runs."""
    for k in range(topo.nodes):
        ends = ((topo.node_ns(k), UPLINK_IF), (topo.switch_ns, f"n{k}"))
        for ns, dev in ends:
            run_command(["ip", "netns", "exec", ns, "nft", "delete", "table", "netdev",
                         loss_table(dev)], check=False)
        for cmd in link_commands(*ends[0], *ends[1], link):
            run_command(cmd)


def down_links(topo: Topology) -> list[str]:
    """Descriptions of the links that are not up (for a failed job's diagnosis)."""
    found = []
    for k in range(topo.nodes):
        state = link_state(topo.node_ns(k), UPLINK_IF)
        if state != "up":
            ranks = [s.rank for s in topo.slots() if s.node == k]
            found.append(f"uplink of node {topo.node_host(k)} is {state} (ranks "
                         f"{', '.join(map(str, ranks))} cut off from the other nodes)")
    for s in topo.slots():
        state = link_state(s.ns, RANK_IF)
        if state != "up":
            found.append(f"link of rank {s.rank} ({s.host}) is {state}")
    return found
