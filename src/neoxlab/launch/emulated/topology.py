"""The emulated cluster as data: namespace and interface names, addresses, and the `ip`/`tc`
commands that build it. Pure (nothing runs here), so the plan can be read and tested anywhere.

Layout (every name below lives only inside namespaces this module names):

    <prefix>-n<K>r<J>  rank J of node K: `eth0` (10.<subnet>.<K>.<J+1>/16)
        | veth                      intra link: shaped at both ends
    <prefix>-n<K>      node K: bridge `br0` with ports `r<J>` (its ranks) and `nic` (its NIC)
        | veth                      uplink, shared by the node's ranks: shaped at both ends
    <prefix>-sw        the switch: bridge `br0` with one port `n<K>` per node

One layer-2 segment: no routes, no gateway, no address outside the namespaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from neoxlab.config.emulated import EmulatedConfig, LinkConfig

RANK_IF = "eth0"  # the rank's only interface (GLOO_SOCKET_IFNAME)
UPLINK_IF = "nic"  # the node's end of its uplink (its NIC)
BRIDGE = "br0"
# tbf needs a bucket that holds the largest packet; veth hands over GSO packets of up to
# 64 KiB, so a smaller bucket would drop them all
MIN_BURST_BYTES = 96 * 1024
QUEUE_LATENCY_MS = 200  # tbf queue: packets wait at most this long, then drop (a switch buffer)


@dataclass(frozen=True)
class RankSlot:
    rank: int
    node: int
    local: int
    ns: str
    addr: str
    host: str  # its name in the hosts files


@dataclass(frozen=True)
class Topology:
    prefix: str
    nodes: int
    ranks_per_node: int
    subnet: int
    intra: LinkConfig
    inter: LinkConfig

    @classmethod
    def from_config(cls, emu: EmulatedConfig, nodes: int, ranks_per_node: int) -> Topology:
        return cls(emu.prefix, nodes, ranks_per_node, emu.subnet, emu.intra, emu.inter)

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def ctl_ns(self) -> str:
        """The Slurm controller's namespace on the switch (slurm.py only)."""
        return f"{self.prefix}-ctl"

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def node_host(self, node: int) -> str:
        """The node's name for the MPI launcher (-hosts)."""
        return f"n{node}"

    def rank_ns(self, node: int, local: int) -> str:
        return f"{self.prefix}-n{node}r{local}"

    def slots(self) -> list[RankSlot]:
        """Ranks in the launcher's block order: node 0's ranks first."""
        return [
            RankSlot(node * self.ranks_per_node + j, node, j, self.rank_ns(node, j),
                     f"10.{self.subnet}.{node}.{j + 1}", f"n{node}r{j}")
            for node in range(self.nodes) for j in range(self.ranks_per_node)
        ]

    def namespaces(self) -> list[str]:
        return [self.switch_ns, *(self.node_ns(k) for k in range(self.nodes)),
                *(s.ns for s in self.slots())]

    def owns(self, namespace: str) -> bool:
        """Whether a namespace name is one this prefix creates (stale ones included)."""
        return re.fullmatch(rf"{re.escape(self.prefix)}-(sw|ctl|n\d+(r\d+)?)",
                            namespace) is not None


def problems(emu: EmulatedConfig, nodes: int, ranks_per_node: int, world: int) -> list[str]:
    """Every reason this emulated cluster cannot be built or cannot hold the job."""
    found = []
    if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", emu.prefix):
        found.append(f"cluster.emulated.prefix='{emu.prefix}' must be 1-12 lower-case letters "
                     "or digits starting with a letter; pick e.g. 'nxemu'")
    if not 0 <= emu.subnet <= 255:
        found.append(f"cluster.emulated.subnet={emu.subnet} must be in 0..255 (10.<subnet>.x.y)")
    if not 1 <= nodes <= 254:
        found.append(f"cluster.nodes={nodes} must be in 1..254 for an emulated cluster")
    if not 1 <= ranks_per_node <= 254:
        found.append(f"cluster.ranks_per_node={ranks_per_node} must be in 1..254")
    if world != nodes * ranks_per_node:
        found.append(
            f"the layout has {world} ranks but the emulated cluster has cluster.nodes={nodes} x "
            f"cluster.ranks_per_node={ranks_per_node} = {nodes * ranks_per_node} slots; every "
            "slot must hold a rank: set cluster.nodes and cluster.ranks_per_node to match")
    for name, link in (("intra", emu.intra), ("inter", emu.inter)):
        if link.rate_mbit is not None and link.rate_mbit <= 0:
            found.append(f"cluster.emulated.{name}.rate_mbit={link.rate_mbit} must be > 0 "
                         "(or null: unshaped)")
        if link.latency_us < 0:
            found.append(f"cluster.emulated.{name}.latency_us={link.latency_us} must be >= 0")
        if not 0 <= link.loss_pct < 100:
            found.append(f"cluster.emulated.{name}.loss_pct={link.loss_pct} must be in [0, 100)")
    return found


def build_commands(topo: Topology) -> list[list[str]]:
    """`ip` and `tc` argument lists that build the cluster from nothing, in order."""
    sw = topo.switch_ns
    cmds = [["ip", "netns", "add", ns] for ns in topo.namespaces()]
    cmds += [["ip", "-n", ns, "link", "set", "dev", "lo", "up"] for ns in topo.namespaces()]
    cmds += _bridge(sw)
    for k in range(topo.nodes):
        node = topo.node_ns(k)
        port = f"n{k}"
        cmds += _bridge(node)
        cmds += [
            ["ip", "-n", node, "link", "add", UPLINK_IF, "type", "veth", "peer", "name", port,
             "netns", sw],
            *_no_gso(node, UPLINK_IF), *_no_gso(sw, port),
            ["ip", "-n", node, "link", "set", "dev", UPLINK_IF, "master", BRIDGE, "up"],
            ["ip", "-n", sw, "link", "set", "dev", port, "master", BRIDGE, "up"],
        ]
        cmds += link_commands(node, UPLINK_IF, sw, port, topo.inter)
    for s in topo.slots():
        node, port = topo.node_ns(s.node), f"r{s.local}"
        cmds += [
            ["ip", "-n", s.ns, "link", "add", RANK_IF, "type", "veth", "peer", "name", port,
             "netns", node],
            *_no_gso(s.ns, RANK_IF), *_no_gso(node, port),
            ["ip", "-n", node, "link", "set", "dev", port, "master", BRIDGE, "up"],
            ["ip", "-n", s.ns, "addr", "add", f"{s.addr}/16", "dev", RANK_IF],
            ["ip", "-n", s.ns, "link", "set", "dev", RANK_IF, "up"],
        ]
        cmds += link_commands(s.ns, RANK_IF, node, port, topo.intra)
    return cmds


def _no_gso(ns: str, dev: str) -> list[list[str]]:
    """One wire-sized packet per buffer, as a real NIC sends them: a 64 KiB GSO packet would
    be dropped whole by the loss rule (38 packets at once) and counted as one packet."""
    return [["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"]]


def _bridge(ns: str) -> list[list[str]]:
    return [["ip", "-n", ns, "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "-n", ns, "link", "set", "dev", BRIDGE, "up"]]


def shaping_commands(ns: str, dev: str, link: LinkConfig) -> list[list[str]]:
    """The egress qdiscs of one end of a link: tbf for the rate, under netem for half the
    one-way latency when there is one; `replace`, so it also reshapes a running cluster.
    Loss is not here: see loss_commands."""
    tc = ["tc", "-n", ns, "qdisc"]
    tbf = []
    if link.rate_mbit is not None:
        rate_bytes = link.rate_mbit * 1e6 / 8
        burst = max(MIN_BURST_BYTES, int(rate_bytes * 0.004))
        tbf = ["tbf", "rate", f"{link.rate_mbit:g}mbit", "burst", str(burst),
               "latency", f"{QUEUE_LATENCY_MS}ms"]
    if link.latency_us <= 0:
        if not tbf:
            return [[*tc, "replace", "dev", dev, "root", "pfifo_fast"]]
        return [[*tc, "replace", "dev", dev, "root", "handle", "1:", *tbf]]
    cmds = [[*tc, "replace", "dev", dev, "root", "handle", "1:", "netem", "delay",
             f"{link.latency_us / 2:g}us", "limit", "100000"]]
    if tbf:
        cmds.append([*tc, "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf])
    return cmds


def loss_table(dev: str) -> str:
    """One nftables table per interface, so one link's loss can be changed alone."""
    return f"neoxlab_loss_{dev}"


def loss_commands(ns: str, dev: str, loss_pct: float) -> list[list[str]]:
    """Random drops of packets arriving at `dev` (nftables, netdev ingress): the kernels at
    hand lack netem, whose `loss` would otherwise do this. Empty for no loss."""
    if loss_pct <= 0:
        return []
    nft = ["ip", "netns", "exec", ns, "nft"]
    per_100k, table = round(loss_pct * 1000), loss_table(dev)
    return [
        [*nft, "add", "table", "netdev", table],
        [*nft, "add", "chain", "netdev", table, "ingress",
         f'{{ type filter hook ingress device "{dev}" priority 0 ; policy accept ; }}'],
        [*nft, "add", "rule", "netdev", table, "ingress",
         "numgen", "random", "mod", "100000", "lt", str(per_100k), "drop"],
    ]


def link_commands(
    ns: str, dev: str, peer_ns: str, peer_dev: str, link: LinkConfig
) -> list[list[str]]:
    """Both ends of one link: each end shapes what it sends and drops some of what arrives."""
    return (shaping_commands(ns, dev, link) + shaping_commands(peer_ns, peer_dev, link)
            + loss_commands(ns, dev, link.loss_pct) + loss_commands(peer_ns, peer_dev,
                                                                    link.loss_pct))


def hosts_file(topo: Topology, slot: RankSlot, machine_hostname: str) -> str:
    """/etc/hosts as a rank sees it: this machine's name is the rank's own address (so MPI
    and the rendezvous find it), and every rank's name resolves."""
    lines = ["127.0.0.1\tlocalhost", f"{slot.addr}\t{machine_hostname}"]
    lines += [f"{s.addr}\t{s.host}" for s in topo.slots()]
    return "\n".join(lines) + "\n"
