"""Run directories: readable unique ids, frozen inputs, provenance and status.

A run dir is never overwritten, and every file is written atomically (temp + rename), so a
crash leaves either the old file or the new one, never half of one. The one exception is
status.json on a full disk: its new state is written over its old blocks (write_status).
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
import time
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from neoxlab.config import Config, from_dict, to_dict
from neoxlab.files import REPO_ROOT, disk_full, now, rewrite_in_place
from neoxlab.files import read_json as read_json  # re-exported: rundir.read_json etc. are
from neoxlab.files import write_atomic as write_atomic  # neoxlab.files' one writer
from neoxlab.files import write_json as write_json
from neoxlab.layout import Layout, estimate_memory


class State(StrEnum):
    """Every state status.json can hold (a StrEnum: it is written and compared as text)."""

    PLANNED = "planned"  # run dir frozen, nothing started
    SUBMITTED = "submitted"  # job script handed to the scheduler
    STARTING = "starting"  # the cluster job began (jobstep begin), ranks not yet up
    RUNNING = "running"  # rank 0 opened an attempt
    REQUEUED = "requeued"  # stopped before walltime, the same job script resubmitted
    PREEMPTED = "preempted"  # checkpointed and stopped on request; `make resume` continues
    COMPLETED = "completed"
    FAILED = "failed"
    PREDICTED = "predicted"  # task=predict: the performance model's answer, nothing ran


TRACKED_PACKAGES = (
    "neoxlab", "torch", "deepspeed", "megatron-core", "mpi4py", "mpich", "hydra-core",
    "omegaconf", "zfpy", "transformers", "wandb",
)


def config_hash(cfg: Config) -> str:
    blob = json.dumps(to_dict(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:8]


def run_id(cfg: Config, dp: int) -> str:
    """Readable and sortable: time, layout, scheme and a hash of the resolved config."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p = cfg.parallel
    return (
        f"{stamp}_tp{p.tp}-pp{p.pp}-dp{dp}_z{cfg.zero.stage}_{cfg.compression.scheme}"
        f"_{config_hash(cfg)}"
    )


def create_run_dir(cfg: Config, dp: int, root: Path | None = None) -> Path:
    """A new directory; a clash (same second, same config) gets a numeric suffix."""
    base = (root or Path(cfg.launch.results_dir)) / cfg.experiment
    base.mkdir(parents=True, exist_ok=True)
    rid = run_id(cfg, dp)
    for attempt in range(1000):
        path = base / (rid if attempt == 0 else f"{rid}.{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        (path / "logs").mkdir()
        return path
    raise RuntimeError(f"could not create a unique run dir under {base}")


def freeze(cfg: Config, layout: Layout, argv: list[str] | None = None, root: Path | None = None
           ) -> Path:
    """A new run dir holding the (checked) config, its layout and provenance; state planned."""
    run_dir = create_run_dir(cfg, layout.dp, root)
    data = to_dict(cfg)
    write_json(run_dir / "config.json", data)
    write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(data)))
    memory = estimate_memory(cfg, layout)
    write_json(
        run_dir / "layout.json",
        {
            "world_size": layout.world_size, "tp": layout.tp, "pp": layout.pp,
            "dp": layout.dp, "micro_batch": layout.micro_batch,
            "grad_accum": layout.grad_accum, "global_batch": layout.global_batch,
            "memory_estimate_gib": {
                "weights": memory.weights / 2**30, "gradients": memory.gradients / 2**30,
                "optimizer": memory.optimizer / 2**30, "activations": memory.activations / 2**30,
                "communication": memory.communication / 2**30,
                "residuals": memory.residuals / 2**30, "total": memory.total / 2**30,
            },
        },
    )
    write_json(run_dir / "provenance.json", provenance(layout.world_size, argv))
    set_status(run_dir, State.PLANNED)
    return run_dir


def git_state() -> dict[str, Any]:
    """The commit and dirty flag of this checkout; None for both without git (an installed
    copy, or a machine without the git binary), which provenance then records as unknown."""
    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
        except FileNotFoundError:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    sha = git("rev-parse", "HEAD")
    return {"sha": sha or None, "dirty": bool(git("status", "--porcelain")) if sha else None}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(world_size: int, argv: list[str] | None = None) -> dict[str, Any]:
    return {
        "created_at": now(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "git": git_state(),
        "world_size": world_size,
        "command": argv if argv is not None else sys.argv,
    }


STATUS_TEXT_IN_PLACE = 200  # characters kept of each text field when the full record won't fit


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Write status.json atomically; on a full disk, over its own blocks instead, so that
    every reader sees the new state (a failed run not left `running`), then raise the
    disk-full error all the same (the caller reports it; status_in_place says what was kept).
    Compact JSON first; if that needs more room than the file holds, without the attempt
    history and with text fields cut."""
    try:
        write_json(path, status)
    except OSError as exc:
        if disk_full(exc) is None:
            raise
        text = json.dumps(status, sort_keys=True, default=str)
        if rewrite_in_place(path, text):
            exc.status_in_place = f"state {status.get('state')}"
        else:
            kept = {k: (v[:STATUS_TEXT_IN_PLACE] if isinstance(v, str) else v)
                    for k, v in status.items() if k != "attempts"}
            if rewrite_in_place(path, json.dumps(kept, sort_keys=True, default=str)):
                exc.status_in_place = f"state {status.get('state')}, attempts left out"
        raise


def set_status(run_dir: Path, state: State, **fields: Any) -> dict[str, Any]:
    """Update status.json; keeps earlier fields (e.g. started_at) and stamps this state."""
    path = run_dir / "status.json"
    status = read_json(path) if path.exists() else {}
    status.update(fields)
    status["state"] = state
    status[f"{state}_at"] = now()
    write_status(path, status)
    return status


# Keys describing how the previous attempt ended; a new attempt starts without them (each
# attempt keeps its own outcome in status["attempts"]).
_OUTCOME_KEYS = ("failed_rank", "error", "exit_code", "elapsed_s", "preempted_step", "signal")
UNRECORDED_END = "ended without recording its end (killed, or its node was lost)"


def begin_attempt(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Append an attempt {start, end, exit, reason} to status.json and set state running.

    An earlier attempt still open was ended by something that could not record it (SIGKILL,
    a lost node, a scheduler requeue without our launcher); it is closed as such."""
    path = run_dir / "status.json"
    status = read_json(path) if path.exists() else {}
    attempts = status.setdefault("attempts", [])
    if attempts and attempts[-1].get("end") is None:
        attempts[-1].update(end=now(), exit=None, reason=UNRECORDED_END)
    attempts.append({"start": now(), "end": None, "exit": None, "reason": None, **fields})
    for key in _OUTCOME_KEYS:
        status.pop(key, None)
    status["state"] = State.RUNNING
    status["running_at"] = attempts[-1]["start"]
    write_status(path, status)
    return status


def update_attempt(run_dir: Path, **fields: Any) -> None:
    """Add facts to the current attempt (e.g. the step it resumed from)."""
    path = run_dir / "status.json"
    status = read_json(path)
    if status.get("attempts"):
        status["attempts"][-1].update(fields)
        write_status(path, status)


def end_attempt(run_dir: Path, exit_code: int | None, reason: str, overwrite: bool = False
                ) -> None:
    """Close the current attempt; one already closed keeps its record unless overwrite."""
    path = run_dir / "status.json"
    status = read_json(path) if path.exists() else {}
    attempts = status.get("attempts")
    if not attempts or (attempts[-1].get("end") is not None and not overwrite):
        return
    attempts[-1].update(end=attempts[-1].get("end") or now(), exit=exit_code, reason=reason)
    write_status(path, status)


def load_config(run_dir: Path) -> Config:
    return from_dict(read_json(run_dir / "config.json"))
