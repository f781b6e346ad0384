"""`python -m neoxlab.neox.entry <run_dir>`: one GPT-NeoX rank, started by jsrun/srun.

deepy.py reads the YAML once, serializes every argument as base64 JSON and hands it to each
rank's train.py as `--megatron_config` (NeoXArgs.consume_neox_args decodes it; the
`--deepspeed_config` it also passes is read only for autotuning). This entry builds the same
argument from the run's neox.yml, so no deepy.py and no DeepSpeed runner are needed:

  discover the rank (MPI) -> export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* -> install the
  compression patch -> run <neox_dir>/train.py as __main__ -> comm accounting, metrics.
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

import yaml

from neoxlab.comm.report import format_totals, merge
from neoxlab.config import Config
from neoxlab.neox import inject
from neoxlab.neox.launch import LOCK_FILE, read_lock
from neoxlab.neox.metrics import collect_metrics
from neoxlab.neox.render import NEOX_YML
from neoxlab.run import dist, rundir
from neoxlab.run.rankjob import run_rank


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
    LOCAL_RANK equals it. With one visible GPU per rank (jsrun -g1, srun --gpus-per-task=1)
    that is 0 on every rank; with all of a node's GPUs visible it is the node-local rank,
    provided ranks are placed in blocks per node."""
    if device_count < 1:
        return node_local_rank
    device = rank % device_count
    if device_count > 1 and device != node_local_rank % device_count:
        raise RuntimeError(
            f"rank {rank} is node-local rank {node_local_rank} with {device_count} visible GPUs:"
            f" GPT-NeoX would put it on GPU {device}, shared with another rank of this node; "
            "place ranks in blocks per node (jsrun -d packed, srun --distribution=block) or "
            "give each rank one GPU (jsrun -g1 -a1, srun --gpus-per-task=1)"
        )
    return device


def _device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_train_py(argv: list[str], neox_dir: Path) -> None:
    """GPT-NeoX's train.py as __main__, from its checkout root (as deepy.py users run it)."""
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = list(argv)
    sys.path.insert(0, str(neox_dir))
    os.chdir(neox_dir)  # its default git_hash comes from `git rev-parse` in the cwd
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"GPT-NeoX's train.py exited with {exc.code}") from None
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)


def build_data_helpers(neox_dir: Path) -> None:
    """Rank 0 builds GPT-NeoX's C++ dataset helpers once, before any rank starts train.py.

    GPT-NeoX runs `make` in megatron/data on every LOCAL_RANK 0 - every rank when each sees
    one GPU - in a checkout shared by all nodes; built beforehand, those makes are no-ops."""
    data = neox_dir / "megatron" / "data"
    if not (data / "Makefile").exists():
        return
    proc = subprocess.run(["make", "-C", str(data)], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building GPT-NeoX's dataset helpers (make -C {data}) failed: "
            f"{proc.stderr.strip()[-2000:]}; GPT-NeoX needs a C++ compiler and pybind11 in "
            "the job's environment"
        )


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
    neox_dir = Path(cfg.cluster.neox_dir or "").resolve()
    local = gpu_local_rank(info.rank, info.local_rank, _device_count())
    os.environ["LOCAL_RANK"] = str(local)
    os.environ[inject.RUN_DIR_ENV] = str(run_dir)
    inject.install_from_env()  # before train.py imports and initializes DeepSpeed
    if info.rank == 0:
        record_provenance(run_dir, neox_dir)
        print(f"[neoxlab] GPT-NeoX {neox_dir} on {info.world_size} ranks", file=terminal,
              flush=True)
        build_data_helpers(neox_dir)
    _barrier()
    run_train_py(train_argv(run_dir, neox_dir), neox_dir)
    sys.stdout.flush()
    inject.write_rows(info.rank)
    _barrier()
    if info.rank == 0:
        finish(cfg, run_dir, info.world_size, terminal)


def _barrier() -> None:
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
        sys.exit("usage: python -m neoxlab.neox.entry <run_dir>")
    sys.exit(main(Path(sys.argv[1])))
