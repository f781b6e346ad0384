"""What every training rank runs: init distributed -> build engine -> resume -> train -> report.

A run dir with a usable checkpoint resumes from it, whoever starts the ranks (make resume,
or a cluster job script rerunning `python -m neoxlab.engines.builtin <run_dir>` after a requeue).

The frame around it (logs, markers, status, failure handling) is neoxlab.run.rankjob.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import deepspeed
import torch
import torch.distributed.distributed_c10d as c10d
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from megatron.core import parallel_state

from neoxlab import metrics
from neoxlab.comm import mpi_group
from neoxlab.comm.classify import Grid
from neoxlab.comm.group_backends import GroupRouter
from neoxlab.comm.install import install_for_run, skip_unused_deepspeed_op
from neoxlab.comm.records import format_totals, merge, write_rank_rows
from neoxlab.compress import kernels as codec_kernels
from neoxlab.config import Config
from neoxlab.engines.builtin import checkpoint_io
from neoxlab.engines.builtin.checkpoint_io import Resumed
from neoxlab.engines.builtin.data import TokenWindows, micro_batches
from neoxlab.engines.builtin.model.pipe import build_pipeline_model
from neoxlab.engines.builtin.online import OnlineRecheck
from neoxlab.engines.builtin.preemption import StopSignals, signal_name, stop_request_file
from neoxlab.engines.builtin.reporting import StepReporter
from neoxlab.layout import Layout, resolve_layout
from neoxlab.run import device, rundir
from neoxlab.run.rankjob import Preempted, run_rank

HOLD_POLL_S = 0.5  # launch.hold_step: how often the held ranks ask whether to stop


class InjectedFailure(RuntimeError):
    """Raised on purpose (launch.fail_rank) to test the failure path."""


def comm_timeout(cfg: Config) -> timedelta | None:
    """How long a collective waits for a peer before it raises. launch.comm_timeout_s also
    becomes the default of every group made later (Megatron's and DeepSpeed's new_group pass
    none), so a cut link fails the job instead of hanging it."""
    if cfg.launch.comm_timeout_s is None:
        return None  # the engines' defaults
    timeout = timedelta(seconds=cfg.launch.comm_timeout_s)
    c10d.default_pg_timeout = timeout
    return timeout


def init_distributed(cfg: Config, layout: Layout):
    """torch.distributed through DeepSpeed, then megatron-core's TP/PP groups."""
    on_gpu = torch.cuda.is_available() and cfg.cluster.device != "cpu"
    backend = cfg.engine.backend
    if backend == "auto":
        backend = "nccl" if on_gpu else "gloo"
    if on_gpu or backend == "nccl":
        # the visible GPU of this rank (one per rank under jsrun -g 1), LOCAL_RANK to match:
        # DeepSpeed calls set_device(LOCAL_RANK) again
        choice = device.select_device()
        print(f"[neoxlab] device {choice.describe()}", flush=True)
        if torch.cuda.is_available():  # Triton, NVRTC or torch ops: one line, in summary.json
            codec_kernels.chosen(torch.device("cuda", choice.index))
    timeout = comm_timeout(cfg)
    # install_for_run skips it too; rank programs without the patch (tests/integration/
    # hf_rank.py, studies/neox_equivalence_rank.py) would otherwise build it (~35 s of C++)
    skip_unused_deepspeed_op()
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                               **({"timeout": timeout} if timeout else {}))
    if cfg.engine.group_backends:
        # megatron-core's and DeepSpeed's groups, made from here on, get their dimension's
        # backend (e.g. DP on MPI)
        GroupRouter(Grid(tp=layout.tp, pp=layout.pp, dp=layout.dp),
                    cfg.engine.group_backends).install()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp
    )
    return PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)


def build_engine(cfg: Config, layout: Layout, topology, ds_config: dict):
    model = build_pipeline_model(
        cfg.model, topology, cfg.train.seed, cfg.parallel.activation_checkpointing,
        cfg.parallel.partition_method,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
    return engine


class StepRunner:
    """One training step exactly as train() runs it: train_batch, then rank 0's reporting.

    A unit of its own so that bench/harness_overhead.py times the very code of the loop
    (not a copy) against a bare train_batch on the same engine.
    """

    def __init__(self, cfg: Config, layout: Layout, engine, windows, dp_rank: int, reporter,
                 patch=None, resumed: Resumed | None = None):
        self.cfg, self.layout, self.engine = cfg, layout, engine
        self.windows, self.dp_rank, self.reporter = windows, dp_rank, reporter
        self.patch = patch
        self.resumed = resumed or Resumed(0)
        self.hardware_flops, self.model_flops = metrics.iteration_flops(
            cfg, layout.tp, layout.global_batch)
        self.records: list[dict[str, Any]] = list(reporter.earlier) if reporter else []

    def batches(self, step: int) -> Iterator:
        """This DP rank's micro-batches of 1-based training step `step`."""
        layout = self.layout
        return micro_batches(
            self.windows, step - 1, layout.global_batch, self.dp_rank, layout.micro_batch,
            layout.grad_accum,
        )

    def step(self, step: int) -> dict[str, Any] | None:
        """Train one batch; on rank 0 build, report and keep its metrics record."""
        batches = self.batches(step)
        if self.patch is not None:
            self.patch.begin_step()
        lr = self.engine.get_lr()[0]  # the rate this step applies (the scheduler steps inside)
        start = time.perf_counter()
        loss = self.engine.train_batch(data_iter=batches)
        elapsed = time.perf_counter() - start
        if self.reporter is None:
            return None
        layout, cfg = self.layout, self.cfg
        grad_norm = self.engine.get_global_grad_norm()
        record = metrics.step_record(
            step=step, iteration_s=elapsed, loss=float(loss), lr=lr,
            grad_norm=None if grad_norm is None else float(grad_norm),
            global_batch=layout.global_batch, seq_length=cfg.model.seq_length,
            hardware_flops=self.hardware_flops, model_flops=self.model_flops,
            world_size=layout.world_size, peak_tflops=cfg.cluster.peak_tflops,
        )
        record["time"] = time.time()  # wall clock at the step's end (start-up benchmarks)
        self.reporter.report(record)
        self.records.append(record)
        return record

    def finish(self, run_dir: Path) -> None:
        """Rank 0: close the reporter and write summary.json (medians over steady steps)."""
        if self.reporter is None:
            return
        self.reporter.close()
        summary = metrics.summarize(self.records, self.cfg.train.metrics_warmup_steps)
        summary.update(
            hardware_flops_per_iteration=self.hardware_flops,
            global_batch=self.layout.global_batch,
            codec_kernels=codec_kernels.report(),  # per device: triton, nvrtc or torch, why
        )
        rundir.write_json(run_dir / "summary.json", summary)


def prepare(cfg: Config, run_dir: Path, rank: int, terminal: TextIO | None):
    """Everything before the first step; shared with bench/ranks/overhead_rank.py.

    Returns (runner, patch, layout); patch is None when compression.patch is off."""
    torch.manual_seed(cfg.train.seed)
    torch.set_num_threads(cfg.engine.torch_threads)
    layout = resolve_layout(cfg)
    patch = install_for_run(cfg, layout)  # before DeepSpeed caches torch.distributed functions
    topology = init_distributed(cfg, layout)
    ds_config = json.loads((run_dir / "deepspeed.json").read_text())
    engine = build_engine(cfg, layout, topology, ds_config)
    resumed = checkpoint_io.restore(engine, patch, run_dir, rank, layout.global_batch)
    if rank == 0:
        announce_resume(run_dir, resumed, terminal)
    windows = TokenWindows(cfg.data, cfg.model.seq_length)
    dp_rank = topology.get_coord(rank).data
    reporter = StepReporter(cfg, run_dir, terminal, resumed.step) if rank == 0 else None
    if reporter is not None and reporter.dropped:
        print(f"[neoxlab] metrics.jsonl: dropped {reporter.dropped} line(s) after step "
              f"{resumed.step} from an earlier attempt; those steps run again", flush=True)
    runner = StepRunner(cfg, layout, engine, windows, dp_rank, reporter, patch, resumed)
    return runner, patch, layout


def announce_resume(run_dir: Path, resumed: Resumed, terminal: TextIO | None) -> None:
    """Rank 0: warnings on the terminal and in its log, the choice in status.json."""
    lines = [f"[neoxlab] warning: {w}" for w in resumed.warnings]
    if resumed.step:
        lines.append(f"[neoxlab] resuming after step {resumed.step} from {resumed.path}")
    for line in lines:
        print(line, flush=True)
        if terminal is not None:
            print(line, file=terminal, flush=True)
    rundir.update_attempt(
        run_dir, resumed_from=resumed.step,
        checkpoint=str(resumed.path) if resumed.path else None, warnings=resumed.warnings,
    )


def train(cfg: Config, run_dir: Path, rank: int, terminal: TextIO | None) -> None:
    # before set-up: a stop request then ends the first step
    stop = StopSignals(stop_request_file(run_dir)).install()
    try:
        runner, patch, layout = prepare(cfg, run_dir, rank, terminal)
        fresh = runner.resumed.step == 0  # testing aids fire only in attempts from step 0
        t, launch = cfg.train, cfg.launch
        online = (OnlineRecheck.for_run(run_dir, patch, rank)
                  if patch is not None and cfg.compression.scheme == "auto" else None)
        slow = patch.slow_link if patch is not None else None
        for step in range(runner.resumed.step + 1, t.steps + 1):
            if fresh and launch.fail_rank == rank and step == launch.fail_step:
                raise InjectedFailure(f"injected failure on rank {rank} at step {step}")
            if slow is not None:  # compression=auto's stand-in for a slower link
                slow.active = step >= cfg.compression.auto.slow_link_from_step
            runner.step(step)
            if online is not None:
                online.after_step(step)
            signum = stop.agreed() if step < t.steps else 0
            while fresh and step == launch.hold_step and not signum:
                time.sleep(HOLD_POLL_S)  # a job held until its scheduler's stop signal
                signum = stop.agreed()
            if signum or (t.checkpoint_every and step % t.checkpoint_every == 0):
                die = fresh and launch.kill_during_checkpoint == step and launch.kill_rank == rank
                path = checkpoint_io.save(
                    runner.engine, patch, run_dir, step, rank, layout.world_size,
                    layout.global_batch, t.keep_checkpoints, die_halfway=die,
                )
                print(f"[neoxlab] checkpoint saved: {path}", flush=True)
            if signum:
                finish(runner, patch, run_dir, rank, layout, terminal)
                name = signal_name(signum)
                raise Preempted(f"{name} after step {step}; checkpoint {path}",
                                preempted_step=step, signal=name)
    finally:
        stop.uninstall()
    finish(runner, patch, run_dir, rank, layout, terminal)


def finish(runner: StepRunner, patch, run_dir: Path, rank: int, layout: Layout,
           terminal: TextIO | None) -> None:
    """summary.json and the communication accounting (of this attempt) of every rank."""
    runner.finish(run_dir)
    if mpi_group.CALLS:
        print(f"[neoxlab] {mpi_group.BACKEND} process groups ran {mpi_group.summary()}",
              flush=True)
    if patch is not None:
        write_rank_rows(run_dir, rank, patch.accountant)
        if patch.capture is not None:
            patch.capture.save(run_dir, rank)
    torch.distributed.barrier()
    if patch is not None and rank == 0:
        print(format_totals(merge(run_dir, layout.world_size)), file=terminal, flush=True)


def main(run_dir: Path) -> int:
    return run_rank(run_dir, lambda cfg, info, terminal: train(cfg, run_dir, info.rank, terminal))
