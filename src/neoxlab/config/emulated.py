"""Settings of an emulated cluster (`cluster.emulated`): its links and where it lives.

Kept apart from neoxlab.config so the netem package can be read and tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LinkConfig:
    """One kind of link. Rate and loss hold in each direction; latency is one-way."""

    rate_mbit: float | None = None  # Mbit/s (1 MB/s = 8 Mbit/s); null: unshaped
    latency_us: float = 0.0  # added one-way delay (split over the link's two ends)
    loss_pct: float = 0.0  # packets dropped at random, per direction


@dataclass
class EmulatedConfig:
    """Network namespaces per rank, a bridge per node, one uplink per node into a switch."""

    prefix: str = "nxemu"  # namespace names: <prefix>-sw, <prefix>-n<K>, <prefix>-n<K>r<J>
    subnet: int = 213  # rank addresses 10.<subnet>.<node>.<local rank + 1>/16
    intra: LinkConfig = field(default_factory=LinkConfig)  # rank <-> its node bridge
    inter: LinkConfig = field(default_factory=LinkConfig)  # node uplink <-> the switch
    keep: bool = False  # leave the namespaces up after the run (debugging)
