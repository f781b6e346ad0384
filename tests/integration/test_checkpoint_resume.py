"""Checkpoints and resume: on 8 CPU ranks (TP=2 x PP=2 x DP=2, ZeRO-1) an interrupted run
resumed from its checkpoint trains exactly as an uninterrupted one; on 4 (TP=2 x PP=2, half
the start-up) a rank killed while writing a checkpoint, or a damaged checkpoint, leaves an
older one to resume from, and SIGUSR1 or a stop request saves a checkpoint and stops the job
with exit code 85 (requeue), once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from neoxlab.engines.builtin import checkpoints
from neoxlab.engines.builtin.preemption import stop_request_file
from neoxlab.run.rankjob import PREEMPTED_EXIT
from tests.conftest import REPO_ROOT
from tests.integration.harness import (
    FOUR_RANKS,
    processes_of,
    read_metrics,
    read_status,
    resume_run,
    run_experiment,
)

N = 3  # steps before the interruption; the runs train 2N
LOSSY_DP_WITH_ERROR_FEEDBACK = "compression.dims.dp.error_feedback=true"  # zfp rate 8 on dp


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def steps_of(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def usable_steps(run_dir: Path) -> list[int]:
    return [c.step for c in checkpoints.usable(checkpoints.scan(run_dir))]


def residuals(run_dir: Path, step: int, rank: int) -> dict:
    state = torch.load(checkpoints.rank_state_path(run_dir, step, rank), weights_only=False)
    return state["compression"]["residuals"]


@pytest.mark.timeout(900)
def test_resumed_run_trains_bit_identically(tmp_path):
    """Lossy zfp on DP gradients with error feedback: the residuals, the optimizer and its
    ZeRO partitions, the LR schedule and the data position must all come back exactly."""
    common = ("local_zhybrid", LOSSY_DP_WITH_ERROR_FEEDBACK, f"train.steps={2 * N}",
              f"train.checkpoint_every={N}")
    proc, reference = run_experiment(common[0], tmp_path / "ref", *common[1:])
    assert proc.returncode == 0, output(proc)
    proc, run_dir = run_experiment(common[0], tmp_path / "cut", *common[1:],
                                   "launch.fail_rank=5", f"launch.fail_step={N + 1}")
    assert proc.returncode != 0 and read_status(run_dir)["state"] == "failed"
    assert steps_of(run_dir) == list(range(1, N + 1))
    assert usable_steps(run_dir) == [N]

    proc = resume_run(run_dir)
    assert proc.returncode == 0, output(proc)
    assert f"resuming after step {N}" in output(proc)
    assert sorted(p.name for p in run_dir.parent.iterdir()) == [run_dir.name]  # no new run dir
    ref, resumed = read_metrics(reference), read_metrics(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, 2 * N + 1))
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in resumed] == [r[key] for r in ref], key  # exact, not approx
    status = read_status(run_dir)
    assert status["state"] == "completed"
    assert [(a["exit"], a["resumed_from"]) for a in status["attempts"]] == [(1, 0), (0, N)]

    # One residual per gradient bucket, the same buckets at every step (not one per step).
    early, late = residuals(reference, N, 0), residuals(reference, 2 * N, 0)
    assert early and early.keys() == late.keys()
    assert all(r.abs().sum() > 0 for r in late.values())


@pytest.mark.timeout(600)
def test_rank_killed_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path):
    proc, run_dir = run_experiment(
        "local_3d", tmp_path, "train.steps=4", "train.checkpoint_every=2",
        "launch.kill_during_checkpoint=4", "launch.kill_rank=3", *FOUR_RANKS,
    )
    assert proc.returncode != 0
    assert read_status(run_dir)["state"] == "failed"
    assert steps_of(run_dir) == [1, 2, 3, 4]  # step 4 trained; its checkpoint never committed
    half_written = checkpoints.rank_state_path(run_dir, 4, 3)
    assert half_written.is_file() and not (half_written.parent.parent / checkpoints.MARKER).exists()
    assert usable_steps(run_dir) == [2]

    proc = resume_run(run_dir)
    assert proc.returncode == 0, output(proc)
    status = read_status(run_dir)
    assert status["state"] == "completed"
    assert status["attempts"][-1]["resumed_from"] == 2
    assert any("step4" in w and "no completion marker" in w
               for w in status["attempts"][-1]["warnings"])
    assert steps_of(run_dir) == [1, 2, 3, 4]  # every step exactly once
    assert usable_steps(run_dir) == [4, 2]  # rewritten, and the older one kept


@pytest.mark.timeout(600)
def test_damaged_checkpoints_are_skipped_with_a_warning(failed_at_step_5):
    """The session's `failed_at_step_5` (conftest: a checkpoint every step, rank 3 raises at
    step 5), shared with the failure test, which reads only the outcome it recorded."""
    proc, run_dir = failed_at_step_5.proc, failed_at_step_5.run_dir
    assert proc.returncode != 0
    assert usable_steps(run_dir) == [4, 3, 2, 1]
    step = {s: checkpoints.root(run_dir) / checkpoints.tag(s) for s in (2, 3, 4)}
    (step[4] / checkpoints.MARKER).unlink()
    layer = step[3] / "layer_01-model_00-model_states.pt"
    layer.write_bytes(layer.read_bytes()[:100])
    unreadable = checkpoints.rank_state_path(run_dir, 2, 1)  # same size, not a torch file
    unreadable.write_bytes(b"\0" * unreadable.stat().st_size)

    proc = resume_run(run_dir)
    assert proc.returncode == 0, output(proc)
    warnings = [line for line in output(proc).splitlines() if "warning" in line]
    assert any(str(step[4]) in w and "no completion marker" in w for w in warnings), warnings
    assert any(str(step[3]) in w and "truncated" in w for w in warnings), warnings
    assert any(str(step[2]) in w and "rank 1 could not load it" in w for w in warnings), warnings
    assert "resuming after step 1" in output(proc)
    assert read_status(run_dir)["attempts"][-1]["resumed_from"] == 1
    assert steps_of(run_dir) == [1, 2, 3, 4, 5]


def _wait_for_steps(results: Path, launcher: subprocess.Popen, steps: int) -> Path:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = list(results.glob("local_3d/*/metrics.jsonl"))
        if found and found[0].read_text().count("\n") >= steps:
            return found[0].parent
        assert launcher.poll() is None, launcher.communicate()[0]
        time.sleep(0.2)
    pytest.fail("training did not start in time")


def _stop_after(results: Path, process: subprocess.Popen, steps: int, stop) -> str:
    """Once metrics.jsonl has `steps` lines, stop(); the process's output when it has ended."""
    try:
        _wait_for_steps(results, process, steps)
        stop()
        out, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    return out.decode(errors="replace")  # bytes: text mode would turn each '\r' into '\n'


@pytest.mark.timeout(900)
def test_stop_signal_and_stop_request_each_stop_once_and_resume_exactly(results_dir, tmp_path):
    """SIGUSR1 to the launcher, then a stop.request file in the resumed attempt: each saves a
    checkpoint and stops the job with exit code 85 (requeue). The next resume does not obey
    the request again: it trains to the end, every step once, with the losses of an
    uninterrupted run. Not on a terminal, progress comes as plain lines, no '\\r' frames."""
    steps = 12  # the first stop comes after step 2-4, the second 1-3 steps later
    overrides = ["logger.wandb=disabled", f"train.steps={steps}", *FOUR_RANKS]
    proc, reference = run_experiment("local_3d", tmp_path / "reference", *overrides)
    assert proc.returncode == 0, output(proc)
    popen = {"cwd": REPO_ROOT, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    launcher = subprocess.Popen([sys.executable, "-m", "neoxlab", "experiment=local_3d",
                                 f"launch.results_dir={results_dir}", *overrides], **popen)
    # The launcher hands the signal to mpiexec, which forwards it to every rank.
    outputs = [_stop_after(results_dir, launcher, 2,
                           lambda: launcher.send_signal(signal.SIGUSR1))]
    run_dir = next(results_dir.glob("local_3d/*"))
    assert launcher.returncode == PREEMPTED_EXIT, outputs[0]
    status = read_status(run_dir)
    assert status["state"] == "preempted" and status["signal"] == "SIGUSR1", status
    first = status["preempted_step"]
    assert 2 <= first < steps
    assert status["attempts"][0]["exit"] == PREEMPTED_EXIT
    assert usable_steps(run_dir) == [first]  # checkpoint_every=0: only the requested one
    assert steps_of(run_dir) == list(range(1, first + 1))
    assert not processes_of(run_dir)

    resumed = subprocess.Popen([sys.executable, "-m", "neoxlab", "resume", str(run_dir)], **popen)
    outputs.append(_stop_after(results_dir, resumed, first + 1,
                               lambda: stop_request_file(run_dir).touch()))
    assert resumed.returncode == PREEMPTED_EXIT, outputs[1]
    status = read_status(run_dir)
    second = status["preempted_step"]
    assert first < second < steps and status["signal"] == "SIGUSR1", status
    assert stop_request_file(run_dir).exists()  # still there, as after a user's request

    proc = subprocess.run([sys.executable, "-m", "neoxlab", "resume", str(run_dir)],
                          timeout=240, **popen)  # as resume_run, but bytes
    outputs.append(proc.stdout.decode(errors="replace"))
    assert proc.returncode == 0, outputs[2]
    status = read_status(run_dir)
    assert status["state"] == "completed"
    assert [(a["exit"], a["resumed_from"]) for a in status["attempts"]] == [
        (PREEMPTED_EXIT, 0), (PREEMPTED_EXIT, first), (0, second)]
    assert not stop_request_file(run_dir).exists()  # consumed by the attempt's launch
    ref, run = read_metrics(reference), read_metrics(run_dir)
    assert [r["step"] for r in run] == list(range(1, steps + 1))  # every step exactly once
    assert [r["loss"] for r in run] == [r["loss"] for r in ref]  # exact, not approx

    for text in outputs:  # captured, not a terminal: one plain line per progress report
        assert "\r" not in text
    shown = [line for line in outputs[2].splitlines() if "local_3d: step " in line]
    assert shown and shown[-1].startswith(f"[neoxlab] local_3d: step {steps}/{steps} (100%)")
    assert all("loss=" in line and "elapsed" in line for line in shown), shown
