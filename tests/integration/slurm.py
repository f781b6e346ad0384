"""Helpers for tests that submit real jobs to the local Slurm that .ci/slurm-up starts.

slurm_ready() says why Slurm cannot be used, emulated_slurm_problem() why the emulated
cluster's own Slurm (cluster.launcher=srun) cannot; skip_or_fail() skips with that reason on a
dev machine without Slurm, and fails instead where CI sets NEOXLAB_REQUIRE_SLURM=1.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time

import pytest

from neoxlab.config.emulated import EmulatedConfig
from neoxlab.launch.emulated import slurm as emulated_slurm
from neoxlab.launch.emulated.topology import Topology
from neoxlab.launch.slurm import job_state

# Job states after which a job never runs again (scontrol keeps them for MinJobAge seconds).
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
})
USABLE_NODE_STATES = frozenset({"idle", "mix", "alloc"})
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "scancel")
QUERY_TIMEOUT_S = 10.0
START_HINT = "start it with `bash .ci/slurm-up` (root)"
REQUIRE_ENV = "NEOXLAB_REQUIRE_SLURM"


def _query(*cmd: str) -> subprocess.CompletedProcess | None:
    """Run a Slurm client with a short timeout; None when it hangs (controller gone)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def slurm_ready() -> str | None:
    """None when jobs can be submitted and run now, else the reason they cannot."""
    missing = [tool for tool in CLIENTS if shutil.which(tool) is None]
    if missing:
        return f"Slurm clients not installed ({', '.join(missing)} not on PATH); {START_HINT}"
    ping = _query("scontrol", "ping")
    if ping is None or "is UP" not in ping.stdout:
        lines = [] if ping is None else (ping.stdout + ping.stderr).strip().splitlines()
        said = lines[0] if lines else "no answer"
        return f"Slurm controller not responding (scontrol ping: {said}); {START_HINT}"
    info = _query("sinfo", "-h", "-o", "%t")
    states = [] if info is None else info.stdout.split()
    # sinfo appends flags such as '*' (not responding) or '~' (powered off) to the state.
    if not any(state in USABLE_NODE_STATES for state in states):
        return f"no usable Slurm node (sinfo states: {states or 'none'}); {START_HINT}"
    return None


@functools.cache
def slurm_ready_cached() -> str | None:
    return slurm_ready()


@functools.cache
def emulated_slurm_problem() -> str | None:
    """None when the emulated cluster can start its own Slurm (slurm-wlm installed, munged
    answering), else why not with the fix. Any small topology: what is missing is the
    machine's, not the layout's."""
    topo = Topology.from_config(EmulatedConfig(), 2, 1)
    return "; ".join(emulated_slurm.problems(topo)) or None


def skip_or_fail(reason: str | None) -> None:
    """Nothing when reason is None; else skip with it, or fail where CI requires Slurm."""
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def wait_for_job(job_id: str, timeout_s: float, poll_s: float = 0.5) -> str:
    """Poll until the job reaches a final state and return it; TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state in FINAL_STATES:
            return state
        if "no longer known" in state:  # no later poll can answer: say so now
            raise RuntimeError(f"Slurm job {job_id}: {state} (MinJobAge in .ci/slurm-up)")
        time.sleep(poll_s)
    raise TimeoutError(f"Slurm job {job_id} not finished after {timeout_s}s (state {state})")


def cancel(job_id: str) -> None:
    """Cancel a job (no error when it already ended), so a failed test leaves nothing queued."""
    _query("scancel", job_id)
