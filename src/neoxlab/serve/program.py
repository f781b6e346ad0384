"""What every serve rank runs: discover -> init TP groups -> build the model -> every policy
on every trace -> results in the run dir (rank 0) -> table.

Mirrors the training program's contract with the launcher: output in logs/rank<N>.log,
logs/rank<N>.pid at start, logs/rank<N>.done at the end, errors in rank<N>.error.json and
an abort of the whole job, status.json from planned to running to completed or failed.

The rank computes on the device cluster.device names (run.device.rank_device: its GPU, or
the host); TP groups use that device's backend (NCCL or gloo). In strict-device mode
(NEOXLAB_STRICT_DEVICE=1, as for training) the program runs under torch's default device
"meta": a tensor made without naming its device lands there and the run fails, so a CPU
run proves that weights, cache and every per-step tensor sit on the rank's device.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

import torch

from neoxlab.comm.strict import strict_from_env
from neoxlab.config import Config
from neoxlab.run import device, rundir
from neoxlab.run.progress import Progress
from neoxlab.run.rankjob import run_rank
from neoxlab.serve import native_attention
from neoxlab.serve.distributed import init_model_parallel
from neoxlab.serve.hf_cb import CBSizing
from neoxlab.serve.model import ServeModel
from neoxlab.serve.rules import check_serve
from neoxlab.serve.runner import Runner, RunSettings, ratios
from neoxlab.serve.scheduler import Control, Sampling
from neoxlab.serve.stats import format_table
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import WorkloadSpec, make_workload, trace_json


def settings_of(cfg: Config):
    s = cfg.serve
    return RunSettings(
        slots=s.slots, max_concurrent=s.max_concurrent or s.slots, max_seq_len=s.max_seq_len,
        window_s=s.batch_window_ms / 1000,
        sampling=Sampling(s.sampling, s.temperature, s.top_k, s.eos_token_id),
        cb_sizing=CBSizing(s.hf_cb_num_blocks, s.hf_cb_max_batch_tokens, s.hf_cb_page_size),
        weights=s.weights, seed=cfg.train.seed, repeats=s.repeats, cb_tune=s.hf_cb_tune,
    )


def traces_of(cfg: Config, vocab_size: int):
    """(nominal gap ms, spec, requests) per gap: the same requests, arrivals scaled."""
    s = cfg.serve
    out = []
    for gap in s.gaps_ms or [s.mean_gap_ms]:
        spec = WorkloadSpec(s.num_requests, s.arrival, gap * s.gap_scale / 1000,
                            (s.prompt_len_min, s.prompt_len_max),
                            (s.output_len_min, s.output_len_max), vocab_size, s.seed)
        out.append((gap, spec, make_workload(spec)))
    return out


def start(cfg: Config, rank: int) -> ServeModel:
    """This rank's device (a GPU asked for but missing is refused here, before anything
    starts), its TP groups on that device's backend, and the model placed there."""
    where, described = device.rank_device(cfg.cluster.device)
    print(f"[serve] device {described}", flush=True)
    init_model_parallel(cfg.parallel.tp, where)
    s = cfg.serve
    model = build_serve_model(cfg.model, s.weights, cfg.train.seed, cfg.parallel.tp, rank,
                              s.max_seq_len, where)
    model.lean = s.lean_decode and cfg.parallel.tp == 1
    model.use_packed_linear(s.packed_linear, s.packed_linear_timed)
    return model


def serve(cfg: Config, run_dir: Path, rank: int, world: int, terminal: TextIO | None) -> None:
    check_serve(cfg)
    torch.set_num_threads(cfg.engine.torch_threads)
    strict = strict_from_env()
    with torch.device("meta") if strict else contextlib.nullcontext():
        _serve(cfg, run_dir, rank, world, terminal, strict)


def _serve(cfg: Config, run_dir: Path, rank: int, world: int, terminal: TextIO | None,
           strict: bool) -> None:
    model = start(cfg, rank)
    comm = None
    if world > 1:
        # deferred: mpi4py initialises MPI on import
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    s = cfg.serve
    attention = model.use_native_attention(s.native_attention)  # built before any timing
    traces = traces_of(cfg, model.config.vocab_size)
    if rank == 0:
        rundir.write_json(run_dir / "workload.json", {"traces": [
            trace_json(g, s.gap_scale, spec, reqs) for g, spec, reqs in traces]})
    runner = Runner(model, settings_of(cfg), Control(comm))
    rows, request_rows = [], []
    progress = Progress(len(traces), cfg.experiment, terminal if cfg.logger.progress else None,
                        unit="trace", every=1)
    for gap, _, requests in traces:
        got, per_req = runner.run_all(list(s.policies), requests, gap)
        rows += got
        request_rows += per_req
        print(f"[serve] gap {gap} ms done", flush=True)
        progress.update(1, gap_ms=gap)
    progress.close()
    if rank == 0:
        lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in request_rows)
        rundir.write_atomic(run_dir / "serve_results.jsonl", lines)
        rundir.write_json(run_dir / "summary.json", {
            "task": "serve", "policies": rows, "ratios": ratios(rows),
            "model": {"layers": model.config.num_layers, "hidden": model.config.hidden_size,
                      "heads": model.config.num_attention_heads, "tp": cfg.parallel.tp,
                      "weights": s.weights, "weights_source": model.source},
            "gap_scale": s.gap_scale,
            "device": str(model.device), "strict_device": strict,
            "decode_attention": attention,  # serve.native_attention: native, or sdpa and why
            "decode_attention_calls": native_attention.calls,  # rank 0's kernel calls
            "hf_cb_sizing": asdict(runner.cb_sizing) if "hf_cb" in s.policies else None,
            "hf_cb_tuning": runner.cb_tuning,
        })
        table = format_table(rows)
        print(table, flush=True)
        if terminal is not None:
            terminal.write(table + "\n")
            terminal.flush()
    torch.distributed.barrier()


def main(run_dir: Path) -> int:
    return run_rank(
        run_dir,
        lambda cfg, info, terminal: serve(cfg, run_dir, info.rank, info.world_size, terminal),
    )
