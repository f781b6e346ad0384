"""compression=auto on the emulated cluster with a real link change: 2 emulated nodes x 2 ranks
(TP inside a node, DP across) start at 300 Mbit/s uplinks; once metrics.jsonl shows step
RESHAPE_AT the test reshapes the running cluster's uplinks to 40 Mbit/s
(launch.emulated.cluster.reshape_uplinks, tc replace). The first re-check after it finds DP's link
changed and switches DP to ZFP rate 16 (which the model finds not worth its codec seconds
at 300 Mbit/s) once, on every rank at the same step.

Needs root and iproute2 (started by MPICH's hydra, no Slurm; skips with the reason
elsewhere) and the emulated cluster's in-situ profile at 300 Mbit/s for 2 nodes x 2 ranks
(the model the plan is priced with): the one cached under results/ when there is one, else
measured first into the test's own results dir (`calibrate --insitu`, a few minutes of omb
runs inside the emulated cluster), so a fresh checkout (CI) runs it too."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neoxlab.comm.online import RECORD_FILE
from neoxlab.config.compose import compose_experiment
from neoxlab.launch.emulated import cluster
from neoxlab.launch.emulated.topology import Topology
from neoxlab.tune import insitu
from tests.conftest import REPO_ROOT
from tests.integration.harness import read_status

PREFIX, SUBNET = "nxonline", 224  # not the experiment's, so a user's cluster is never touched
EVERY, RESHAPE_AT, STEPS, WITHIN = 5, 10, 40, 20
ARGS = [f"cluster.emulated.prefix={PREFIX}", f"cluster.emulated.subnet={SUBNET}",
        "cluster.emulated.inter.rate_mbit=300", "cluster.launcher=mpiexec",
        f"train.steps={STEPS}", "launch.timeout_s=900", "logger.wandb=disabled",
        "logger.progress=false", "compression=auto", f"compression.auto.recheck_every={EVERY}",
        # neox_tiny 4x wider: DP's gradients (about 6 MB a step) take the uplink's time, not
        # its latency, so the drop shows in DP's seconds beyond a busy machine's noise
        "model.hidden_size=256",
        # ZFP rate 16 halves the bytes for codec seconds the model finds worth it below about
        # 4 MB/s a rank with this machine's in-situ profile: at 40 Mbit/s, not at 300
        "compression.auto.codecs=[none,'zfp:rate=16']"]
CFG = compose_experiment("emulated_2x2", ARGS)
TOPO = Topology.from_config(CFG.cluster.emulated, CFG.cluster.nodes, CFG.cluster.ranks_per_node)
PROFILE = REPO_ROOT / "results" / insitu.cache_path(CFG).relative_to(CFG.launch.results_dir)

_missing = cluster.prerequisite_problem()
pytestmark = [pytest.mark.skipif(_missing is not None, reason=_missing or ""),
              pytest.mark.timeout(2100)]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("online_emulated")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    if PROFILE.exists():  # the plan's model, as measured on this machine before
        shutil.copytree(PROFILE.parent, results / insitu.INSITU)
    else:  # a fresh checkout: measure it first, as the docs tell a user to
        calibrate = [sys.executable, "-m", "neoxlab.commands.calibrate", "--insitu",
                     "experiment=emulated_2x2", *ARGS, f"launch.results_dir={results}"]
        proc = subprocess.run(calibrate, cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    cmd = [sys.executable, "-m", "neoxlab", "experiment=emulated_2x2",
           f"launch.results_dir={results}", *ARGS]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for_step(results / "emulated_2x2", proc, RESHAPE_AT)
        cluster.reshape_uplinks(TOPO, dataclasses.replace(CFG.cluster.emulated.inter,
                                                          rate_mbit=40))
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.teardown(TOPO)
    assert proc.returncode == 0 and read_status(run_dir)["state"] == "completed"
    return run_dir


def wait_for_step(root: Path, proc: subprocess.Popen, step: int) -> Path:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        runs = sorted(root.iterdir()) if root.exists() else []
        metrics = runs[-1] / "metrics.jsonl" if runs else None
        if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= step:
            return runs[-1]
        time.sleep(0.2)
    pytest.fail(f"no step {step} within 600 s (exit {proc.poll()})")


def test_the_run_retunes_within_20_steps_of_the_drop_once(run):
    rs = [json.loads(line) for line in (run / RECORD_FILE).read_text().splitlines()]
    after = [r for r in rs if r["step"] > RESHAPE_AT + 1]
    dp = {r["step"]: next(d for d in r["dims"] if d["dim"] == "dp") for r in rs}
    # the last window before the drop, and the first after it (the median step of its
    # EVERY steps: a step or two run before the reshape has finished do not move it)
    before, first = RESHAPE_AT // EVERY * EVERY, (RESHAPE_AT // EVERY + 1) * EVERY
    assert first <= RESHAPE_AT + WITHIN
    assert dp[first]["changed"], (dp[before], dp[first])
    assert dp[first]["estimated_gbs"] < dp[before]["estimated_gbs"] / (1 + rs[0]["margin"])
    assert not any("dp" in r["switches"] for r in rs if r["step"] <= before), rs
    dp_switches = [(r["step"], r["switches"]["dp"]) for r in after if "dp" in r["switches"]]
    assert dp_switches == [(first, "zfp:rate=16")], rs  # one change, one switch
    assert sum("zero" in r["switches"] for r in after) <= 1, rs  # the other inter-node one


def test_every_rank_switched_at_the_same_step(run):
    found = [re.findall(r"compression=auto: after step \d+ switched .*", log.read_text())
             for log in sorted((run / "logs").glob("rank*.log"))]
    assert len(found) == 4 and all(f == found[0] for f in found), found
