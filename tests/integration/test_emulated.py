"""2 emulated nodes x 2 ranks (TP inside a node, DP across), started by the cluster's own
multi-node Slurm: training, the uplinks' byte counters against the comm accounting, a killed
run's leftovers, packet loss, a cut link; and the same job started by MPICH's hydra.

Needs root and iproute2 (CI has both) and slurm-wlm with a running munged (`make slurm-up`;
CI runs it); skips with the reason elsewhere (without Slurm: fails where CI requires it). One
baseline run is shared by most tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neoxlab.config.emulated import EmulatedConfig
from neoxlab.launch.emulated import cluster, slurm
from neoxlab.launch.emulated.topology import Topology
from neoxlab.perfmodel.wire import accounted_between_nodes, payload_bytes
from tests.conftest import REPO_ROOT
from tests.integration.harness import processes_of, read_metrics, read_status, run_experiment

PREFIX, SUBNET = "nxtest", 223  # not the experiment's, so a user's cluster is never touched
ARGS = (f"cluster.emulated.prefix={PREFIX}", f"cluster.emulated.subnet={SUBNET}",
        "train.steps=3", "launch.timeout_s=300")
TOPO = Topology.from_config(EmulatedConfig(prefix=PREFIX, subnet=SUBNET), 2, 2)

_missing = cluster.prerequisite_problem()
pytestmark = [pytest.mark.skipif(_missing is not None, reason=_missing or ""),
              pytest.mark.usefixtures("requires_emulated_slurm")]


def our_namespaces() -> list[str]:
    return [ns for ns in cluster.existing_namespaces() if TOPO.owns(ns)]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("emulated")


@pytest.fixture(scope="module")
def baseline(results) -> Path:
    proc, run_dir = run_experiment("emulated_2x2", results, *ARGS, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_trains_three_steps_across_two_nodes_placed_by_slurm(baseline):
    assert read_status(baseline)["state"] == "completed"
    assert [m["step"] for m in read_metrics(baseline)] == [1, 2, 3]
    network = json.loads((baseline / "network.json").read_text())
    assert {r["node"] for r in network["ranks"]} == {0, 1} and network["links_down"] == []
    logs = baseline / "logs" / "slurm"
    assert "NodeList=n[0-1]" in (logs / "slurmctld.log").read_text()  # one job on both nodes
    for node in ("n0", "n1"):  # each node's own slurmd started its 2 ranks
        launched = (logs / f"slurmd.{node}.log").read_text().count("launch task StepId=")
        assert launched == 1, (node, launched)
    assert our_namespaces() == [] and not processes_of(baseline) and not slurm_daemons()


def test_hydra_starts_the_same_job_with_the_same_losses(baseline, results):
    proc, hydra = run_experiment("emulated_2x2", results, *ARGS, "cluster.launcher=mpiexec",
                                 timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [m["loss"] for m in read_metrics(hydra)] == [m["loss"] for m in read_metrics(baseline)]
    assert not (hydra / "logs" / "slurm").exists() and our_namespaces() == []


def test_uplink_counters_match_the_accounted_inter_node_bytes(baseline):
    lines = (baseline / "comm_groups.jsonl").read_text().splitlines()
    accounted = accounted_between_nodes([json.loads(line) for line in lines], lambda r: r // 2)
    uplinks = json.loads((baseline / "network.json").read_text())["uplinks"]
    carried = sum(payload_bytes(counter, "tx") for counter in uplinks.values())
    assert accounted > 1e6, f"too little inter-node traffic to compare: {accounted}"
    assert abs(carried - accounted) <= 0.10 * accounted, (carried, accounted, uplinks)


@pytest.mark.skipif(shutil.which("nft") is None, reason="packet loss needs nft: apt-get "
                    "install nftables")
def test_set_up_over_a_killed_run_then_one_percent_loss_keeps_the_losses(baseline, results):
    before = set(runs_of(results))
    killed = start_run(results, "train.steps=500")
    run_dir = wait_for_step(results, before, killed, 1)
    killed.kill()  # SIGKILL: no teardown; its ranks and Slurm live on
    killed.wait()
    assert len(our_namespaces()) == 8 and slurm_daemons()  # 7 + its controller's
    proc, lossy = run_experiment("emulated_2x2", results, *ARGS,
                                 "cluster.emulated.inter.loss_pct=1", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [m["loss"] for m in read_metrics(lossy)] == [m["loss"] for m in read_metrics(baseline)]
    assert wait_until(lambda: not processes_of(run_dir), 30), "the killed run's ranks survived"
    assert our_namespaces() == [] and not slurm_daemons()


def test_a_cut_uplink_fails_the_job_naming_the_rank_and_the_link(results):
    before = set(runs_of(results))
    proc = start_run(results, "train.steps=500", "launch.comm_timeout_s=15",
                     "launch.timeout_s=600")
    run_dir = wait_for_step(results, before, proc, 1)
    cluster.set_uplink(TOPO, 1, up=False)
    cut = time.monotonic()
    proc.wait(timeout=300)
    took = time.monotonic() - cut
    status = read_status(run_dir)
    assert status["state"] == "failed" and took < 120, (status, took)
    assert status["failed_rank"] is not None and "uplink of node n1 is down" in status["error"]
    assert not processes_of(run_dir) and our_namespaces() == [] and not slurm_daemons()


def slurm_daemons() -> list:
    """slurmctld and slurmd processes of the test cluster's own Slurm (their -f names its
    configuration)."""
    return processes_of(slurm.conf_path(TOPO))


def start_run(results: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_2x2",
           f"launch.results_dir={results}", "logger.wandb=disabled", *ARGS, *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def runs_of(results: Path) -> list[Path]:
    root = results / "emulated_2x2"
    return sorted(root.iterdir()) if root.exists() else []


def wait_for_step(results: Path, before: set[Path], proc: subprocess.Popen, step: int) -> Path:
    """The run dir the process made, once its metrics show `step` (the job is mid-run)."""
    def new_run() -> Path | None:
        fresh = [run for run in runs_of(results) if run not in before]
        return fresh[-1] if fresh else None

    def reached() -> bool:
        run = new_run()
        metrics = run / "metrics.jsonl" if run else None
        return bool(metrics and metrics.exists()
                    and len(metrics.read_text().splitlines()) >= step)

    if not wait_until(reached, 300, proc):
        proc.kill()
        pytest.fail(f"no step {step} within 300 s (exit {proc.poll()})")
    return new_run()


def wait_until(condition, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            return condition()
        time.sleep(0.5)
    return False


@pytest.fixture(autouse=True, scope="module")
def _no_leftovers():
    yield
    cluster.teardown(TOPO)
