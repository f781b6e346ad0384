"""The emulated cluster's multi-node Slurm as a plan (its slurm.conf, the control-plane
commands, the srun step, the rank's namespace) and its refusals; nothing is started here.
tests/integration/test_emulated.py runs it for real (root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from neoxlab.commands.check import check
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.emulated import EmulatedConfig
from neoxlab.launch.cluster_rules import validate_cluster
from neoxlab.launch.emulated import launch as emulated
from neoxlab.launch.emulated import slurm
from neoxlab.launch.emulated.launch import RANK
from neoxlab.launch.emulated.topology import Topology
from neoxlab.tasks import TASKS


def topo(nodes: int = 2, ranks_per_node: int = 2) -> Topology:
    return Topology.from_config(EmulatedConfig(prefix="nxt", subnet=77), nodes, ranks_per_node)


def conf_values(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in text.splitlines()
            if line and not line.startswith("#")]


def test_each_node_has_its_own_slurmd_name_and_address_apart_from_its_ranks():
    t = topo(3, 2)
    text = slurm.render_conf(t, Path("/tmp/logs"), "vm")
    nodes = [line.split() for line in text.splitlines() if line.startswith("NodeName=")]
    assert [n[0] for n in nodes] == ["NodeName=n0", "NodeName=n1", "NodeName=n2"]
    addrs = [n[1].removeprefix("NodeAddr=") for n in nodes]
    assert len(set(addrs)) == 3 and not set(addrs) & {s.addr for s in t.slots()}
    assert all(n[2] == "CPUs=2" for n in nodes)
    assert "PartitionName=emulated Nodes=n0,n1,n2 " in text


def test_its_controller_and_files_are_apart_from_the_machines_own_slurm():
    values = dict(conf_values(slurm.render_conf(topo(), Path("/tmp/logs"), "vm")))
    assert values["SlurmctldHost"] == "vm(10.77.255.254)"
    assert values["SlurmctldPort"] not in ("6817", "6818") and values["ClusterName"] == "nxt"
    state = str(slurm.state_dir(topo()))
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile"):
        assert values[key].startswith(state + "/"), key
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        assert "%n" in values[key], f"{key}: one per slurmd"
    assert values["SlurmdLogFile"].startswith("/tmp/logs/")
    assert slurm.environment(topo()) == {"SLURM_CONF": str(state) + "/slurm.conf"}


def test_the_control_plane_stays_inside_namespaces_of_the_cluster_with_no_routes():
    cmds = slurm.control_plane_commands(topo())
    assert cmds[0] == ["ip", "netns", "add", "nxt-ctl"] and topo().owns("nxt-ctl")
    assert all(c[1] == "-n" and c[2].startswith("nxt-") for c in cmds[1:]), cmds
    assert ["ip", "-n", "nxt-ctl", "addr", "add", "10.77.255.254/16", "dev", "eth0"] in cmds
    bridge_addrs = [c[5] for c in cmds if c[3:5] == ["addr", "add"] and c[-1] == "br0"]
    assert bridge_addrs == ["10.77.0.254/16", "10.77.1.254/16"]
    assert not any("route" in c or "nat" in c for c in cmds)


def test_srun_places_every_rank_and_enters_its_namespace():
    cfg = compose_experiment("emulated_2x2", ["cluster.launcher=srun", "launch.submit=false"])
    cmd = emulated.srun_command(cfg, Path("/tmp/run"), topo(), TASKS["train"].program, None)
    assert cmd[:3] == ["nsenter", "--net=/run/netns/nxt-ctl", "srun"]  # beside its controller
    for flag in ("--nodes=2", "--ntasks-per-node=2", "--ntasks=4", "--mpi=pmi2",
                 "--kill-on-bad-exit=1"):
        assert flag in cmd
    wrapper = cmd.index("sh")
    assert cmd[wrapper + 1:wrapper + 3] == [str(emulated.RANK), "nxt"]


@pytest.mark.parametrize(("env", "namespace"), [
    ({"SLURMD_NODENAME": "n1", "SLURM_LOCALID": "1"}, "nxt-n1r1"),  # srun
    ({"NEOXLAB_EMU_NODE": "n0", "MPI_LOCALRANKID": "1"}, "nxt-n0r1"),  # hydra
])
def test_rank_wrapper_enters_the_ranks_namespace(tmp_path, env, namespace):
    fake_ip = tmp_path / "ip"
    fake_ip.write_text('#!/bin/sh\necho "$@"\n')
    fake_ip.chmod(0o755)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SLURMD_NODENAME", "SLURM_LOCALID", "NEOXLAB_EMU_NODE",
                          "MPI_LOCALRANKID")}
    out = subprocess.run(["sh", str(RANK), "nxt", "hostname"],
                         env={**clean, **env, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
                         capture_output=True, text=True, timeout=10, check=True)
    assert out.stdout.split() == ["netns", "exec", namespace, "hostname"]


def test_rank_wrapper_outside_a_launcher_says_so():
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SLURMD_NODENAME", "SLURM_LOCALID", "NEOXLAB_EMU_NODE")}
    out = subprocess.run(["sh", str(RANK), "nxt", "true"],
                         env=clean, capture_output=True, text=True, timeout=10, check=False)
    assert out.returncode != 0 and "not started by netns_proxy.sh or srun" in out.stderr


def test_missing_slurm_or_munge_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None if name == "slurmd" else name)
    found = slurm.problems(topo())
    assert len(found) == 1 and "slurmd" in found[0] and "make slurm-up" in found[0]
    assert "cluster.launcher=mpiexec" in found[0]
    monkeypatch.setattr(slurm.shutil, "which", lambda name: name)
    monkeypatch.setattr(slurm, "munge_works", lambda: False)
    assert "munged does not answer" in slurm.problems(topo())[0]
    monkeypatch.setattr(slurm, "munge_works", lambda: True)
    assert slurm.problems(topo()) == []
    assert "at most 253" in slurm.problems(topo(1, 254))[0]


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_an_emulated_cluster_takes_srun_or_hydra(launcher):
    cfg = compose_experiment("emulated_2x2", [f"cluster.launcher={launcher}",
                                              "launch.submit=false"])
    assert validate_cluster(cfg) == []


def test_an_emulated_cluster_refuses_other_launchers_before_planning():
    with pytest.raises(ConfigError, match="cluster.launcher='jsrun' does not go with scheduler "
                       "'emulated'; use cluster.launcher=srun"):
        check(compose_experiment("emulated_2x2", ["cluster.launcher=jsrun",
                                                  "launch.submit=false"]))


def test_ranks_under_srun_and_under_hydra_both_start_from_the_fork_server():
    from neoxlab.launch import local

    def cfg(launcher: str):
        return compose_experiment("emulated_2x2", [f"cluster.launcher={launcher}",
                                                   "launch.submit=false"])
    assert local.uses_forkserver(cfg("srun")) and local.uses_forkserver(cfg("mpiexec"))
