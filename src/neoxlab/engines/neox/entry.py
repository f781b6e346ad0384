"""`python -m neoxlab.engines.neox.entry <run_dir>`: one GPT-NeoX rank, started by jsrun/srun.

deepy.py reads the YAML once, serializes every argument as base64 JSON and hands it to each
rank's train.py as `--megatron_config` (NeoXArgs.consume_neox_args decodes it; the
`--deepspeed_config` it also passes is read only for autotuning). This entry builds the same
argument from the run's neox.yml, so no deepy.py and no DeepSpeed runner are needed:

  discover the rank (MPI) -> export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* and align the
  launcher's local-rank variables -> install the compression patch -> rank 0 builds the
  dataset helpers -> run <neox_dir>/train.py as __main__ -> check it finished (a bare exit()
  is a failure) -> comm accounting, metrics.
"""

from __future__ import annotations

import base64
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

import torch
import yaml

from neoxlab.comm.records import format_totals, merge
from neoxlab.config import Config
from neoxlab.engines.builtin.preemption import stop_request_file
from neoxlab.engines.neox import cpu_mode, inject
from neoxlab.engines.neox.data_helpers import build_data_helpers, build_environment
from neoxlab.engines.neox.launch import LOCK_FILE, checkout_dir, read_lock
from neoxlab.engines.neox.metrics import collect_metrics
from neoxlab.engines.neox.outcome import EndedEarly, early_exit_error
from neoxlab.engines.neox.render import NEOX_YML
from neoxlab.engines.neox.stop import StopHook
from neoxlab.run import device, dist, rundir
from neoxlab.run.rankjob import Preempted, run_rank


def megatron_config(run_dir: Path, neox_dir: Path) -> dict[str, Any]:
    """The argument dict deepy.py would send: neox.yml, its text, and the script path."""
    text = (run_dir / NEOX_YML).read_text()
    values = {key.replace("-", "_"): value for key, value in yaml.safe_load(text).items()}
    values["config_files"] = {NEOX_YML: text}  # GPT-NeoX stores these with checkpoints
    values["user_script"] = str(neox_dir / "train.py")
    return values


def encode(values: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode("utf-8")).decode("utf-8")


def train_argv(run_dir: Path, neox_dir: Path) -> list[str]:
    """sys.argv for GPT-NeoX's train.py, as the DeepSpeed launcher would have built it."""
    return [str(neox_dir / "train.py"), "--megatron_config",
            encode(megatron_config(run_dir, neox_dir))]


def gpu_local_rank(rank: int, node_local_rank: int, device_count: int) -> int:
    """The LOCAL_RANK GPT-NeoX accepts: it selects GPU rank % device_count and asserts that
    LOCAL_RANK equals it, while neoxlab.run.device chooses from the node-local rank. With one
    visible GPU per rank (jsrun -g1, srun --gpus-per-task=1) both are 0 on every rank; with
    all of a node's GPUs visible they agree when ranks are placed in blocks per node."""
    if device_count < 1:
        return node_local_rank
    chosen = device.device_index(node_local_rank, device_count)
    if rank % device_count != chosen:
        raise RuntimeError(
            f"rank {rank} is node-local rank {node_local_rank} with {device_count} visible GPUs:"
            f" GPT-NeoX would put it on GPU {rank % device_count}, shared with another rank of "
            "this node; place ranks in blocks per node (jsrun -d packed, "
            "srun --distribution=block) or give each rank one GPU (jsrun -g1 -a1, "
            "srun --gpus-per-task=1)"
        )
    return chosen


def _device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def place_rank(info: dist.RankInfo) -> None:
    """This rank's GPU (neoxlab.run.device, as the builtin engine chooses it) after checking
    that GPT-NeoX will choose the same; LOCAL_RANK and the launcher's variables aligned
    (DeepSpeed asserts they agree). Without a GPU only the variables are aligned."""
    visible = _device_count()
    local = gpu_local_rank(info.rank, info.local_rank, visible)
    if visible:
        device.select_device(info.local_rank)
    else:
        device.align_local_rank(local, info.local_rank)


def run_train_py(argv: list[str], neox_dir: Path) -> None:
    """GPT-NeoX's train.py as __main__, from its checkout root (as deepy.py users run it).

    Returns when training returned; raises EndedEarly when train.py called exit()."""
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = list(argv)
    sys.path.insert(0, str(neox_dir))
    os.chdir(neox_dir)  # its default git_hash comes from `git rev-parse` in the cwd
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        raise EndedEarly(exc.code) from None
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)


def check_ended_early(exc: EndedEarly, run_dir: Path, rank: int) -> None:
    """Raise unless the early exit was asked for (see neoxlab.engines.neox.outcome)."""
    values = yaml.safe_load((run_dir / NEOX_YML).read_text())
    logs = run_dir / "logs"
    names = {f"rank{r}.log": logs / f"rank{r}.log" for r in sorted({0, rank})}
    sys.stdout.flush()
    sys.stderr.flush()
    error = early_exit_error(exc.code, rank, names, values.get("train_iters"),
                             stop_request_file(run_dir).exists(), values.get("exit_interval"))
    if error:
        raise RuntimeError(error) from None


def record_provenance(run_dir: Path, neox_dir: Path) -> None:
    """Which GPT-NeoX ran, next to the commit patches/upstream.lock says was read."""
    out = subprocess.run(["git", "-C", str(neox_dir), "rev-parse", "HEAD"],
                         capture_output=True, text=True, check=False)
    commit = out.stdout.strip() or None
    locked = read_lock().get("gpt_neox_commit") if LOCK_FILE.exists() else None
    rundir.write_json(run_dir / "neox_provenance.json", {
        "neox_dir": str(neox_dir), "commit": commit, "locked_commit": locked,
        "matches_lock": commit == locked if commit and locked else None,
    })


def run(cfg: Config, run_dir: Path, info: dist.RankInfo, terminal: TextIO | None) -> None:
    """The rank body inside neoxlab.run.rankjob.run_rank (logs, status and failure handling)."""
    neox_dir = checkout_dir(cfg).resolve()
    place_rank(info)
    os.environ[inject.RUN_DIR_ENV] = str(run_dir)
    os.environ[cpu_mode.RANKS_PER_NODE_ENV] = str(_ranks_on_this_node())
    inject.install_from_env()  # before train.py imports and initializes DeepSpeed
    build_environment(run_dir)  # GPT-NeoX's own makes of megatron/data: the job's python
    if info.rank == 0:
        record_provenance(run_dir, neox_dir)
        mode = f", {cpu_mode.BANNER}" if cpu_mode.applied() else ""
        print(f"[neoxlab] GPT-NeoX {neox_dir} on {info.world_size} ranks{mode}",
              file=terminal, flush=True)
        build_data_helpers(neox_dir, run_dir)  # a failure aborts the job: no rank waits
    _barrier()
    hook = StopHook(run_dir, cfg.launch.hold_step).install()
    try:
        run_train_py(train_argv(run_dir, neox_dir), neox_dir)
    except EndedEarly as exc:
        if hook.stopped_at is None:
            check_ended_early(exc, run_dir, info.rank)  # raises (-> abort) unless asked for
    finally:
        hook.uninstall()
    sys.stdout.flush()
    inject.write_rows(info.rank)
    _barrier()
    if info.rank == 0:
        finish(cfg, run_dir, info.world_size, terminal)
    if hook.stopped_at is not None:  # GPT-NeoX saved its checkpoint and left its loop
        step, name = hook.stopped_at, hook.signal_name()
        raise Preempted(f"{name} after step {step}; GPT-NeoX checkpoint global_step{step}",
                        preempted_step=step, signal=name)


def _ranks_on_this_node() -> int:
    """The ranks sharing this node (MPI's shared-memory split, as run.dist finds LOCAL_RANK):
    GPT-NeoX's device count in CPU mode, so that rank % count is the local rank."""
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=MPI.COMM_WORLD.Get_rank())
    try:
        return local.Get_size()
    finally:
        local.Free()


def _barrier() -> None:
    # deferred: mpi4py initialises MPI on import
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


def finish(cfg: Config, run_dir: Path, world_size: int, terminal: TextIO | None) -> None:
    """Rank 0 after every rank is done: metrics.jsonl + summary.json, comm totals."""
    collect_metrics(run_dir)
    if inject.current() is not None:
        print(format_totals(merge(run_dir, world_size)), file=terminal, flush=True)


def main(run_dir: Path) -> int:
    run_dir = Path(run_dir).resolve()
    return run_rank(run_dir, lambda cfg, info, terminal: run(cfg, run_dir, info, terminal))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m neoxlab.engines.neox.entry <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
