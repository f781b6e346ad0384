"""A real training run of the builtin engine with compression on (section 7 of
device_check.sh): `python -m neoxlab` as a user starts it, two steps of the tiny model.

    python bench/device/train_step.py [--device cuda|cpu] [--steps 2]

Two DP ranks share the one GPU (gloo with CUDA tensors; NCCL takes one rank per GPU, and a
single rank would have no one to exchange with), so cluster.gpus_per_node is raised to 2 for
the one-rank-per-GPU rule: each rank still picks cuda:0, its node-local rank modulo the one
visible device. Ranks start as fresh interpreters (launch.rank_start=exec): the forkserver
forks them from a process that has imported torch, and a process forked after CUDA's
initialization cannot use the GPU. Every dimension is compressed (compression=naive: ZFP
rate 8, run by the Triton kernels on CUDA). Then the run directory must show: the run
completed, a finite loss every step, compressed DP all-reduces in the communication
records, and on CUDA both ranks naming cuda:0 as their device. `--device cpu`: the same
run on CPU, the dry run. Exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# what a GPU rank prints once it has chosen its device (neoxlab.run.device.DeviceChoice)
DEVICE_LINE = re.compile(r"\[neoxlab\] device cuda:0 of \d+ visible.*node-local rank (\d+)")
EXPERIMENT = "local_dp"  # data parallel only; the world size comes from the overrides


def overrides(device: str, steps: int, results: Path) -> list[str]:
    return [f"experiment={EXPERIMENT}", f"launch.results_dir={results}",
            "logger.wandb=disabled", "cluster.ranks_per_node=2",
            f"cluster.device={device}", "engine.backend=gloo", "compression=naive",
            f"train.steps={steps}", "train.checkpoint_every=0", "train.metrics_warmup_steps=0",
            "cluster.gpus_per_node=2", "launch.rank_start=exec"]


def check(run_dir: Path, device: str, steps: int, output: str) -> list[str]:
    """What is wrong with the run directory and the run's output (empty: nothing)."""
    problems = []
    status = json.loads((run_dir / "status.json").read_text())
    if status.get("state") != "completed":
        problems.append(f"status {status.get('state')!r}, not 'completed'")
    metrics = run_dir / "metrics.jsonl"
    records = ([json.loads(line) for line in metrics.read_text().splitlines()]
               if metrics.exists() else [])
    losses = [r.get("loss") for r in records]
    print(f"losses: {losses}")
    if len(losses) != steps or not all(isinstance(v, float) and math.isfinite(v)
                                       for v in losses):
        problems.append(f"expected {steps} finite losses, got {losses}")
    summary = run_dir / "summary.json"
    comm = json.loads(summary.read_text()).get("comm", {}) if summary.exists() else {}
    dp = comm.get("dp", {})
    print(f"dp traffic: {dp}")
    if not dp.get("compressed_calls"):
        problems.append(f"no compressed DP collective in summary.json's comm: {comm}")
    if device != "cpu":
        logs = output + "".join(p.read_text(errors="replace") for p in run_dir.rglob("*.log"))
        chosen = set(DEVICE_LINE.findall(logs))
        if chosen != {"0", "1"}:
            problems.append(f"node-local ranks {sorted(chosen)} logged cuda:0; both must")
    return problems


def run(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, output). The launcher, mpiexec and the ranks share a
    new process group, ended as a whole when the run outlasts `timeout`."""
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def show_logs(results: Path) -> None:
    """The end of every rank's log, for a run that failed."""
    for log in sorted(results.rglob("logs/*.log")):
        print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cpu: the dry run")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds for the run")
    ap.add_argument("--results", type=Path, help="results dir (default: a temporary one, "
                                                 "removed afterwards)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="device-train-") as tmp:
        return train_and_check(args, args.results or Path(tmp))


def train_and_check(args: argparse.Namespace, results: Path) -> int:
    cmd = [sys.executable, "-m", "neoxlab", *overrides(args.device, args.steps, results)]
    print(" ".join(cmd), flush=True)
    code, output = run(cmd, args.timeout)
    print(output[-4000:], flush=True)
    runs = sorted((results / EXPERIMENT).glob("*"))
    if code != 0 or not runs:
        show_logs(results)
        why = f"no end after {args.timeout:.0f} s" if code is None else f"exit {code}"
        print(f"train_step: FAILED ({why}, {len(runs)} run dir(s))")
        return 1
    problems = check(runs[-1], args.device, args.steps, output)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        show_logs(results)
    print(f"train_step: {'OK' if not problems else 'FAILED'} ({runs[-1].name})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
