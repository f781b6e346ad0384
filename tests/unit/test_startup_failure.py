"""A launcher whose ranks can never start fails the job at once, not at launch.timeout_s."""

from __future__ import annotations

import json
import time

from neoxlab.config.compose import compose_experiment
from neoxlab.launch import local
from neoxlab.launch.emulated import launch as emulated
from neoxlab.launch.failure import STARTUP_FAILED, fatal_startup

PMI2_LINE = "slurmstepd-n2: error: mpi/pmi2: invalid client request"


def test_the_pmi2_parse_error_is_a_fatal_start_up_and_ordinary_output_is_not():
    assert fatal_startup(f"ok\n{PMI2_LINE}\n").startswith(STARTUP_FAILED)
    assert fatal_startup("slurmstepd: error: mpi/pmi2: value not terminated") is None


def test_a_launcher_reporting_it_fails_the_job_within_seconds(tmp_path):
    cfg = compose_experiment("local_baseline", ["launch.timeout_s=300"])
    (tmp_path / "logs").mkdir()
    (tmp_path / "status.json").write_text(json.dumps({"state": "planned"}))
    # the line arrives in two pieces, as a pipe may deliver it
    script = (f"printf '{PMI2_LINE[:30]}'; sleep 1; printf '{PMI2_LINE[30:]}\\n'; "
              "sleep 300")
    started = time.monotonic()
    code = local._launch(cfg, tmp_path, ["sh", "-c", script], {"PATH": "/usr/bin:/bin"})
    elapsed = time.monotonic() - started
    status = json.loads((tmp_path / "status.json").read_text())
    assert code != 0 and elapsed < 30, (code, elapsed)
    assert status["state"] == "failed"
    assert status["error"].startswith(STARTUP_FAILED) and "cluster.launcher=mpiexec" in \
        status["error"]
    assert emulated.never_started(tmp_path)
