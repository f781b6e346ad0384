"""A rendered LSF job script run end to end through STAND-INS for bsub and jsrun.

LSF cannot run here. tests/standins/lsf/{bsub,jsrun} are clearly named stand-ins: bsub
starts the script detached with the LSB_* variables of a real job; jsrun checks the
resource-set flags and maps them onto mpiexec. What this proves: the script our template
renders runs, its ranks discover each other through MPI, and the job records its own end.
What it cannot prove: LSF's parsing of #BSUB lines, jsrun's binding and GPU placement.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from neoxlab.commands.cli import main
from neoxlab.launch import manifest
from tests.integration.harness import processes_of, read_metrics, read_status

STANDINS = Path(__file__).resolve().parents[1] / "standins" / "lsf"


def wait_for_exit(pid: int, timeout_s: float) -> None:
    """The stand-in job (its batch shell) has ended, `jobstep end` included."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)  # polling a pid with a deadline, not synchronizing on time
    raise AssertionError(f"stand-in job {pid} still running after {timeout_s} s")


@pytest.mark.timeout(420)
def test_rendered_lsf_job_runs_through_bsub_and_jsrun_standins(tmp_path, monkeypatch, capsys):
    spool = tmp_path / "spool"
    monkeypatch.setenv("PATH", f"{STANDINS}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_LSF_SPOOL", str(spool))
    results = tmp_path / "results"
    code = main([
        "experiment=local_3d", "cluster=lassen", "cluster.nodes=2", "cluster.ranks_per_node=2",
        "cluster.device=cpu", "cluster.gpus_per_node=0", "cluster.modules=[]", "cluster.env={}",
        "engine.backend=gloo", "train.steps=3", "logger.wandb=disabled",
        f"launch.results_dir={results}",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    (run_dir,) = (results / "local_3d").iterdir()
    (entry,) = manifest.read(results, "local_3d")
    assert f"submitted lsf job {entry['job_id']}" in out
    pid = int((spool / f"job.{entry['job_id']}.pid").read_text())
    try:
        wait_for_exit(pid, 360)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the stand-in job's own session only
        except ProcessLookupError:
            pass
    status = read_status(run_dir)
    job_err = (run_dir / "logs" / f"job.{entry['job_id']}.err").read_text()
    assert status["state"] == "completed", job_err
    assert status["job_id"] == entry["job_id"] and entry["scheduler"] == "lsf"
    assert "jsrun stand-in: 4 sets x 1 tasks (-r 2 -c 20 -g 0 -b packed:20)" in job_err
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]
    # the launch node ("batch1") is not a compute host
    assert "batch1" not in (run_dir / "hostfile").read_text()
    assert status["hosts"] and json.loads(json.dumps(status["hosts"]))
    assert not processes_of(run_dir)
