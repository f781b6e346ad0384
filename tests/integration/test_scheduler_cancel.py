"""The slurm record submits, polls and cancels a real job on this machine's Slurm: what
`make status` and `make resume` ask the record (submit, job_state, live_states, cancel)."""

from __future__ import annotations

import time

from neoxlab.launch.schedulers import SCHEDULERS

DEADLINE_S = 60


def test_the_slurm_record_cancels_a_job_it_submitted(requires_slurm, tmp_path):
    slurm = SCHEDULERS["slurm"]
    script = tmp_path / slurm.script_name
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/job.out\nsleep 600\n")
    job_id = slurm.submit(script)
    assert slurm.job_state(job_id).split()[0] in slurm.live_states
    slurm.cancel(job_id)
    deadline = time.monotonic() + DEADLINE_S
    state = slurm.job_state(job_id)
    while state.split()[0] in slurm.live_states and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the scheduler's answer, bounded by the deadline
        state = slurm.job_state(job_id)
    assert state.startswith("CANCELLED"), state
