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

from neoxlab.__main__ import main
from neoxlab.launch import manifest
from tests.integration.harness import processes_of, read_metrics, read_status

STANDINS = Path(__file__).resolve().parents[1] / "standins" / "lsf"


def wait_for_end(run_dir: Path, timeout_s: float) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = read_status(run_dir)
        if status["state"] in ("completed", "failed") and "exit_code" in status:
            return status
        time.sleep(0.5)  # polling a file with a deadline, not synchronizing on time
    raise AssertionError(f"job did not end in {timeout_s} s: {read_status(run_dir)}")


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
    try:
        status = wait_for_end(run_dir, 360)
    finally:
        pid = int((spool / f"job.{entry['job_id']}.pid").read_text())
        try:
            os.killpg(pid, signal.SIGKILL)  # the stand-in job's own session only
        except ProcessLookupError:
            pass
    job_err = (run_dir / "logs" / f"job.{entry['job_id']}.err").read_text()
    assert status["state"] == "completed", job_err
    assert status["job_id"] == entry["job_id"] and entry["scheduler"] == "lsf"
    assert "jsrun stand-in: 4 sets x 1 tasks (-r 2 -c 20 -g 0 -b packed:20)" in job_err
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]
    # the launch node ("batch1") is not a compute host
    assert "batch1" not in (run_dir / "hostfile").read_text()
    assert status["hosts"] and json.loads(json.dumps(status["hosts"]))
    assert not processes_of(run_dir)
