"""Save and restore a rank's whole training state: DeepSpeed's checkpoint plus our side file.

DeepSpeed's engine.save_checkpoint/load_checkpoint keep the model (one file per pipeline
layer), the optimizer with its ZeRO partitions, the LR schedule and the step counters. Each
rank adds what DeepSpeed does not know, in <step dir>/neoxlab/rank<R>.pt: RNG states (python,
numpy, torch, CUDA, megatron-core's tensor-parallel tracker), the compression patch's
error-feedback residuals and the data position. Control-plane agreement (barriers, the
choice of checkpoint) goes through MPI, so it adds nothing to the communication accounting.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import tensor_parallel

from neoxlab.engines.builtin import checkpoints
from neoxlab.files import write_atomic

CLIENT_STEP_KEY = "neoxlab_step"


def capture_rng() -> dict[str, Any]:
    tracker = tensor_parallel.get_cuda_rng_tracker().get_states()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "megatron_tracker": {name: s.clone() for name, s in tracker.items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state["megatron_tracker"]:
        tensor_parallel.get_cuda_rng_tracker().set_states(dict(state["megatron_tracker"]))


def rank_state(step: int, global_batch: int, patch) -> dict[str, Any]:
    return {
        "step": step,
        # The data order is a pure function of the step
        # (neoxlab.engines.builtin.data.micro_batches).
        "data": {"next_step": step + 1, "samples": step * global_batch,
                 "global_batch": global_batch},
        "rng": capture_rng(),
        "compression": patch.state_dict() if patch is not None else None,
    }


def _write_rank_state(path: Path, state: dict[str, Any], die_halfway: bool) -> None:
    """Atomic (temp + rename); the kill test aid writes half of it in place, then dies."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    if die_halfway:
        with path.open("wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    write_atomic(path, data)


def save(engine, patch, run_dir: Path, step: int, rank: int, world_size: int,
         global_batch: int, keep: int, die_halfway: bool = False) -> Path:
    """Every rank writes its part; after a barrier rank 0 commits (marker) and prunes."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = checkpoints.root(run_dir) / checkpoints.tag(step)
    if rank == 0 and path.exists():  # an unusable leftover: a usable one would be resumed
        shutil.rmtree(path)
    comm.Barrier()
    engine.save_checkpoint(str(checkpoints.root(run_dir)), tag=checkpoints.tag(step),
                           client_state={CLIENT_STEP_KEY: step}, save_latest=False)
    state = rank_state(step, global_batch, patch)
    _write_rank_state(checkpoints.rank_state_path(run_dir, step, rank), state, die_halfway)
    comm.Barrier()  # every rank has written every file it owns
    if rank == 0:
        checkpoints.write_marker(path, step, world_size)
        checkpoints.prune(run_dir, keep)
    comm.Barrier()  # nobody runs ahead (and perhaps fails the job) before the commit
    return path


@dataclass
class Resumed:
    step: int  # steps already trained; 0: a fresh start
    warnings: list[str] = field(default_factory=list)
    path: Path | None = None


def _load(engine, run_dir: Path, c: checkpoints.Checkpoint, rank: int
          ) -> tuple[str | None, dict | None]:
    """(error, rank state): this rank's attempt to load checkpoint c."""
    try:
        load_path, client = engine.load_checkpoint(
            str(checkpoints.root(run_dir)), tag=checkpoints.tag(c.step),
            load_optimizer_states=True, load_lr_scheduler_states=True,
        )
        if load_path is None:
            return "DeepSpeed found no model states in it", None
        if (client or {}).get(CLIENT_STEP_KEY) != c.step:
            return f"its DeepSpeed states name step {(client or {}).get(CLIENT_STEP_KEY)}", None
        state = torch.load(checkpoints.rank_state_path(run_dir, c.step, rank),
                           map_location="cpu", weights_only=False)
        if state["step"] != c.step:
            return f"rank state names step {state['step']}", None
        return None, state
    except Exception as exc:  # noqa: BLE001 - any unreadable file means: use an older one
        return f"{type(exc).__name__}: {exc}", None


def restore(engine, patch, run_dir: Path, rank: int, global_batch: int) -> Resumed:
    """Load the newest checkpoint every rank can load; Resumed(0) when there is none.

    Rank 0's view of the checkpoint directories is the job's. A checkpoint that any rank
    fails to load is skipped (the others then load an older one over it, completely)."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    found = comm.bcast(checkpoints.scan(run_dir) if rank == 0 else None, root=0)
    failures: list[str] = []
    for c in checkpoints.usable(found):
        error, state = _load(engine, run_dir, c, rank)
        errors = comm.allgather(error)
        bad = [(r, e) for r, e in enumerate(errors) if e is not None]
        if bad:
            r, e = bad[0]
            failures.append(f"checkpoint {c.path} skipped: rank {r} could not load it ({e})")
            continue
        if state["data"]["global_batch"] != global_batch:
            raise RuntimeError(
                f"checkpoint {c.path} was written with global batch "
                f"{state['data']['global_batch']}, this run has {global_batch}"
            )
        _finish_restore(engine, patch, state)
        warnings = [checkpoints.describe(s) for s in checkpoints.skipped_newer(found, c.step)]
        return Resumed(c.step, warnings + failures, c.path)
    if failures:  # some ranks may hold a loaded state, others a fresh one: not a step 0
        raise RuntimeError(
            "no checkpoint loads on every rank (" + "; ".join(failures) + "), and a partial "
            "load leaves the ranks' states mixed; move the unloadable checkpoints out of "
            f"{checkpoints.root(run_dir)} (all of it to start over) and resume again"
        )
    warnings = [checkpoints.describe(s) for s in found]
    if found:
        warnings.append(f"no usable checkpoint in {checkpoints.root(run_dir)}: starting from "
                        "step 0")
    return Resumed(0, warnings)


def _finish_restore(engine, patch, state: dict[str, Any]) -> None:
    restore_rng(state["rng"])
    if patch is not None and state["compression"] is not None:
        patch.load_state_dict(state["compression"])
    # ZeRO-1/2: the working weights came from data-parallel rank 0's layer files. Training
    # derives them from each rank's fp32 partition by a copy and a (possibly compressed)
    # all-gather; redo exactly that, so they match whatever the all-gather's compression
    # does to a rank's own part (ours decodes every part, own included, so today it agrees).
    if hasattr(engine.optimizer, "update_lp_params"):
        engine.optimizer.update_lp_params()
