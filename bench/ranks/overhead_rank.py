"""Per-rank program of bench/harness_overhead.py (run under mpiexec, one process per rank).

Sets up exactly as neoxlab.engines.builtin.program.train() does, then alternates blocks (A B B A A B
...) of a bare ``engine.train_batch`` loop (A) with the harness's own ``StepRunner.step`` (B:
train_batch + metrics record + metrics.jsonl + progress bar + wandb) on the same engine,
so both arms see the same model, data and machine load. Rank 0 writes overhead.json.

    mpiexec -n 8 python bench/ranks/overhead_rank.py <run_dir> [--blocks 6] [--k 10] [--warmup 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from neoxlab.engines.builtin.program import prepare
from neoxlab.run import dist, rundir
from neoxlab.run.rankjob import redirect_output


def timed_block(step_fn: Callable[[int], object], first: int, k: int) -> tuple[list[float], float]:
    """Run steps first..first+k-1; per-step wall times and the block's time, barrier to barrier.

    The barriers bound the block on every rank, so a delay rank 0 adds (it is the first
    pipeline stage) is charged to the block even when it surfaces on another rank.
    """
    torch.distributed.barrier()
    block_start = time.perf_counter()
    times = []
    for step in range(first, first + k):
        start = time.perf_counter()
        step_fn(step)
        times.append(time.perf_counter() - start)
    torch.distributed.barrier()
    return times, time.perf_counter() - block_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--blocks", type=int, default=6, help="blocks per arm (A/B alternate)")
    ap.add_argument("--k", type=int, default=10, help="steps per block")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps of each arm first")
    args = ap.parse_args()

    run_dir: Path = args.run_dir
    cfg = rundir.load_config(run_dir)
    info = dist.discover(cfg.launch.master_port)
    terminal = redirect_output(run_dir, info.rank)
    rank = info.rank
    runner, _, layout = prepare(cfg, run_dir, rank, terminal)  # train()'s own set-up
    engine = runner.engine

    def bare(step: int) -> object:
        return engine.train_batch(data_iter=runner.batches(step))

    harness_extra: list[float] = []  # rank 0: StepRunner.step wall time minus its train_batch

    def harnessed(step: int) -> object:
        start = time.perf_counter()
        record = runner.step(step)
        if record is not None:
            harness_extra.append(time.perf_counter() - start - record["iteration_s"])
        return record

    step = 1
    for fn in (bare, harnessed):
        _, _ = timed_block(fn, step, args.warmup)
        step += args.warmup
    harness_extra.clear()
    arms: dict[str, dict[str, list]] = {
        name: {"step_s": [], "block_s": []} for name in ("bare", "harness")
    }
    arm_fns = (("bare", bare), ("harness", harnessed))
    for round_ in range(args.blocks):
        # A B, then B A: order effects and linear drift of the machine hit both arms alike.
        for name, fn in arm_fns if round_ % 2 == 0 else arm_fns[::-1]:
            times, block_s = timed_block(fn, step, args.k)
            step += args.k
            arms[name]["step_s"].extend(times)
            arms[name]["block_s"].append(block_s)
    runner.finish(run_dir)
    if rank == 0:
        result = {
            "blocks": args.blocks, "k": args.k, "warmup": args.warmup,
            "world_size": layout.world_size, "arms": arms, "harness_extra_s": harness_extra,
            "wandb": cfg.logger.wandb, "progress": cfg.logger.progress,
        }
        rundir.write_json(run_dir / "overhead.json", result)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
