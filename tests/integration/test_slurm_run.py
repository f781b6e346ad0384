"""`make run EXP=local_slurm` on the real local Slurm: sbatch + srun --mpi=pmi2, 4 ranks."""

from __future__ import annotations

import time

import pytest

from neoxlab.commands.cli import main
from neoxlab.launch import manifest
from tests.integration.harness import processes_of, read_metrics, read_status
from tests.integration.slurm import cancel, wait_for_job


@pytest.mark.timeout(400)
def test_local_slurm_experiment_runs_through_sbatch_and_srun(requires_slurm, results_dir,
                                                             capsys):
    assert main(["experiment=local_slurm", "train.steps=3",
                 f"launch.results_dir={results_dir}"]) == 0
    out = capsys.readouterr().out
    (entry,) = manifest.read(results_dir, "local_slurm")
    assert f"submitted slurm job {entry['job_id']}" in out
    try:
        state = wait_for_job(entry["job_id"], timeout_s=360)
    finally:
        cancel(entry["job_id"])
    run_dir = results_dir / "local_slurm" / entry["run_id"]
    status = read_status(run_dir)
    err = (run_dir / "logs" / f"job.{entry['job_id']}.err").read_text()
    assert state == "COMPLETED", err
    assert status["state"] == "completed" and status["job_id"] == entry["job_id"]
    assert status["world_size"] == 4
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.done")) == [
        f"rank{r}.done" for r in range(4)]
    assert (run_dir / "hostfile").read_text().split() == [status["hosts"][0], "slots=4"]
    assert not processes_of(run_dir)


@pytest.mark.timeout(300)
def test_failing_rank_under_slurm_fails_the_job_with_its_error(requires_slurm, results_dir):
    assert main(["experiment=local_slurm", "train.steps=3", "launch.fail_rank=2",
                 f"launch.results_dir={results_dir}"]) == 0
    (entry,) = manifest.read(results_dir, "local_slurm")
    try:
        state = wait_for_job(entry["job_id"], timeout_s=240)
    finally:
        cancel(entry["job_id"])
    status = read_status(results_dir / "local_slurm" / entry["run_id"])
    assert state == "FAILED"
    assert status["state"] == "failed" and status["failed_rank"] == 2
    assert status["error"].startswith("InjectedFailure: injected failure on rank 2")


def test_time_limit_job_is_submitted_first(time_limit_job):
    """Moved to the start of the session (conftest): submitting is all it does."""
    (first,) = manifest.read(time_limit_job.results, "local_slurm")
    assert first["job_id"] and first.get("requeue_of") is None


@pytest.mark.timeout(1100)
def test_job_at_its_time_limit_checkpoints_requeues_and_completes(time_limit_job):
    """The job submitted as the session started (conftest.TimeLimitJob) gets Slurm's USR1
    (B:, the batch shell) before its limit: the ranks see the stop request, checkpoint and
    exit 85, `jobstep end` resubmits the job script, the next job resumes; until all steps
    ran. The first job is held after step 20 until the signal, so it ends there however
    fast the machine is, and the second job finishes the other 10 steps."""
    results, steps, held = time_limit_job.results, time_limit_job.steps, time_limit_job.held
    (first, *_) = manifest.read(results, "local_slurm")
    run_dir = results / "local_slurm" / first["run_id"]
    deadline = time.monotonic() + 1040
    try:
        while time.monotonic() < deadline:
            jobs = manifest.read(results, "local_slurm")
            state = wait_for_job(jobs[-1]["job_id"], timeout_s=deadline - time.monotonic())
            if len(manifest.read(results, "local_slurm")) == len(jobs):
                break  # the newest job ended without requeuing: the run is over
    finally:
        for job in manifest.read(results, "local_slurm"):
            cancel(job["job_id"])
    jobs = manifest.read(results, "local_slurm")
    status = read_status(run_dir)
    assert status["state"] == "completed", (status, jobs)
    assert state == "COMPLETED"
    assert len(jobs) == 2, "the first job was expected to reach its time limit, once"
    assert status["attempts"][0]["reason"].startswith(f"preempted: SIGUSR1 after step {held};")
    assert [j["requeue_of"] for j in jobs[1:]] == [j["job_id"] for j in jobs[:-1]]
    reasons = [a.get("reason") for a in status["attempts"]]
    assert len(status["attempts"]) == len(jobs) and reasons[-1] == "completed", reasons
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, steps + 1))
