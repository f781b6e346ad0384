"""The emulated cluster's plan (names, addresses, commands) and its input rules; pure."""

from __future__ import annotations

import pytest

from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.emulated import EmulatedConfig, LinkConfig
from neoxlab.launch.emulated.topology import Topology, build_commands, hosts_file, problems
from neoxlab.perfmodel.wire import accounted_between_nodes, payload_bytes, sent_factor


def topo(**links) -> Topology:
    return Topology.from_config(EmulatedConfig(prefix="nxt", **links), 2, 2)


def test_every_rank_has_its_own_namespace_and_address():
    slots = topo().slots()
    assert [(s.rank, s.node, s.local) for s in slots] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert len({s.ns for s in slots}) == 4 and len({s.addr for s in slots}) == 4
    assert topo().namespaces()[:3] == ["nxt-sw", "nxt-n0", "nxt-n1"]


def test_owns_only_its_own_prefix():
    t = topo()
    assert t.owns("nxt-sw") and t.owns("nxt-n3") and t.owns("nxt-n12r7")
    assert not t.owns("nxt2-n0") and not t.owns("other-n0") and not t.owns("nxt-n0x")


def test_nothing_outside_the_namespaces_and_no_routes():
    for cmd in build_commands(topo(inter=LinkConfig(rate_mbit=100, loss_pct=1))):
        names = [arg for i, arg in enumerate(cmd) if i and (
            cmd[i - 1] in ("-n", "exec") or cmd[i - 1] == "netns" and arg not in ("add", "exec"))]
        if cmd[:3] == ["ip", "netns", "add"]:
            names.append(cmd[3])
        assert names and all(name.startswith("nxt-") for name in names), cmd
        assert "route" not in cmd and "nat" not in cmd


def test_uplink_is_shaped_at_both_ends_and_loses_packets_in_both_directions():
    cmds = build_commands(topo(inter=LinkConfig(rate_mbit=80, loss_pct=1)))
    tbf = [c for c in cmds if "tbf" in c]
    assert {(c[2], c[6]) for c in tbf} == {
        ("nxt-n0", "nic"), ("nxt-sw", "n0"), ("nxt-n1", "nic"), ("nxt-sw", "n1")}
    assert all(c[c.index("rate") + 1] == "80mbit" for c in tbf)
    drops = [c for c in cmds if "drop" in c]
    assert len(drops) == 4 and all(c[c.index("lt") + 1] == "1000" for c in drops)  # 1 %


def test_unshaped_links_get_no_rate_limit():
    assert not [c for c in build_commands(topo()) if "tbf" in c or "netem" in c]


def test_latency_is_split_over_the_two_ends():
    cmds = build_commands(topo(intra=LinkConfig(latency_us=100)))
    delays = [c[c.index("delay") + 1] for c in cmds if "netem" in c]
    assert delays == ["50us"] * 8  # 4 rank links, 2 ends each


def test_hosts_file_names_the_machine_as_the_rank():
    t = topo()
    text = hosts_file(t, t.slots()[2], "vm")
    assert "10.213.1.1\tvm" in text and "10.213.0.2\tn0r1" in text


def test_problems_name_the_value_and_the_fix():
    bad = EmulatedConfig(prefix="Bad-Prefix", inter=LinkConfig(rate_mbit=0, loss_pct=100))
    found = " | ".join(problems(bad, 2, 2, 8))
    for text in ("prefix='Bad-Prefix'", "rate_mbit=0", "loss_pct=100", "8 ranks",
                 "cluster.nodes=2 x cluster.ranks_per_node=2"):
        assert text in found


def test_experiment_refuses_bad_links_before_planning(tmp_path):
    from neoxlab.commands.cli import check_scheduler

    cfg = compose_experiment("emulated_2x2", ["cluster.emulated.inter.rate_mbit=-5",
                                              "launch.submit=false"])
    with pytest.raises(ConfigError, match="inter.rate_mbit=-5.0 must be > 0"):
        check_scheduler(cfg)


def test_wire_model_for_two_rank_groups():
    assert sent_factor("all_reduce", 2) == 1.0 and sent_factor("all_gather_into_tensor", 2) == 1
    assert sent_factor("broadcast", 4) == 0.75 and sent_factor("all_reduce", 1) == 0.0
    rows = [{"rank": 0, "ranks": [0, 2], "op": "all_reduce", "bytes_out": 100},
            {"rank": 2, "ranks": [0, 2], "op": "all_reduce", "bytes_out": 100},
            {"rank": 0, "ranks": [0, 1], "op": "all_reduce", "bytes_out": 999},
            {"rank": 0, "ranks": [0, 1, 2, 3], "op": "all_reduce", "bytes_out": 40}]
    node_of = {0: 0, 1: 0, 2: 1, 3: 1}.get
    # the pair across nodes in full, the pair inside node 0 not at all, the 4-rank ring's
    # 2 node-crossing hops of 4: 40 x 1.5 x 0.5
    assert accounted_between_nodes(rows, node_of) == 200 + 30
    assert payload_bytes({"tx_bytes": 1000, "tx_packets": 2}) == 1000 - 2 * 66
