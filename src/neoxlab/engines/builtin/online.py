"""compression=auto in the training loop: every `recheck_every` steps each rank takes the
median step of what the compression patch measured per dimension since the last re-check
(a step slowed by something other than the link, e.g. a busy shared core, does not move
it), the ranks sum those, rank 0 decides (comm/online.py) and broadcasts the choice, and
every rank switches its codecs before the next step, so all ranks run each step with the
same scheme. Rank 0 appends each re-check to the run dir's tune_online.jsonl.

Each rank's seconds are its own; the mean over the ranks that carried a dimension is set
against the model, which prices one rank's step. On CUDA the per-step split folds in only
the timed calls completed by then (no sync each step); the re-check step waits for all.

The re-check's tensors live on the world group's device: an NCCL world serves CUDA tensors
only. If rank 0's decision fails (say, tune_online.jsonl cannot be written), it still
broadcasts, a failure mark, so that every rank raises instead of waiting in the broadcast.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist  # only where a world group exists

from neoxlab.comm.online import PLAN_FILE, RECORD_FILE, DimTable, Measured, Recheck
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.compress import make_compressor

FIELDS = ("comm_s", "codec_s", "bytes_out", "ranks")  # per dimension, summed over ranks
FAILED = -2  # the choice's status slot when rank 0's decision raised


class RecheckFailed(RuntimeError):
    """Rank 0's re-check raised; the other ranks learn it from the broadcast."""


class Collectives(Protocol):
    device: torch.device  # the device of the tensors the group serves

    def all_reduce(self, tensor: torch.Tensor) -> None: ...
    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...


def group_device(backend: str) -> torch.device:
    """The device a world group of this backend serves: CUDA (the current device) for NCCL,
    which refuses host tensors; the host otherwise."""
    return torch.device("cuda") if "nccl" in backend.lower() else torch.device("cpu")


class RawCollectives:
    """The world group through the patch's unwrapped functions: the re-check's own few
    bytes are neither accounted nor compressed."""

    def __init__(self, patch: CompressionPatch):
        self.raw = patch.raw
        self.device = group_device(str(dist.get_backend()))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.raw.all_reduce(tensor)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.raw.broadcast(tensor, src)


def totals(patch: CompressionPatch, wait: bool) -> dict[str, tuple[float, float, float]]:
    """dim -> comm s, codec s, bytes out so far. `wait`: CUDA-timed calls are waited for
    (at a re-check); otherwise those completed are folded in (no sync every step)."""
    if wait:
        patch.accountant.resolve()
    else:
        patch.accountant.fold_completed()
    out: dict[str, list[float]] = {}
    for (dim, _op), s in patch.accountant.stats.items():
        t = out.setdefault(dim, [0.0, 0.0, 0.0])
        t[0] += s.comm_s
        t[1] += s.compress_s + s.decompress_s
        t[2] += s.bytes_out
    return {d: (t[0], t[1], t[2]) for d, t in out.items()}


class OnlineRecheck:
    def __init__(self, plan: dict, patch: CompressionPatch, rank: int, run_dir: Path,
                 collectives: Collectives | None = None, log=print):
        self.plan, self.patch, self.rank, self.run_dir = plan, patch, rank, run_dir
        self.every = int(plan["recheck_every"])
        self.tables = {d: DimTable.from_dict(t) for d, t in plan["dims"].items()}
        self.dims = sorted(self.tables)
        self.comm = collectives or RawCollectives(patch)
        self.device = self.comm.device
        self.log = log
        self.state = Recheck(self.tables, plan["margin"], plan["start"], plan["reference"])
        self.current = dict(plan["start"])
        self.last: dict[str, tuple[float, float, float]] | None = None  # totals so far
        self.steps: list[dict[str, tuple]] = []  # per step since the last re-check
        for dim, label in self.current.items():
            self._apply(dim, label)

    @classmethod
    def for_run(cls, run_dir: Path, patch: CompressionPatch, rank: int) -> OnlineRecheck:
        path = run_dir / PLAN_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"compression=auto: {path} is missing (the model's plan is priced when a run "
                "is planned to launch; a launch.submit=false plan without the cluster's "
                "profile has none); plan the run again with its profile in place")
        return cls(json.loads(path.read_text()), patch, rank, run_dir)

    def after_step(self, step: int) -> dict[str, str]:
        """After a finished step: its seconds and bytes per dimension are kept (the first
        step's only open the count: its start-up is not the link's); at every
        recheck_every-th step, the re-check on the medians of the steps kept since the last.
        Returns the switches made."""
        now = totals(self.patch, wait=step % self.every == 0)
        if self.last is not None:
            self.steps.append({d: tuple(a - b for a, b in zip(
                v, self.last.get(d, (0.0, 0.0, 0.0)), strict=True)) for d, v in now.items()})
        self.last = now
        if step % self.every or not self.steps:
            return {}
        rows = []
        for dim in self.dims:
            per_step = [s.get(dim, (0.0, 0.0, 0.0)) for s in self.steps]
            medians = [statistics.median(column) for column in zip(*per_step, strict=True)]
            rows.append([*medians, 1.0 if medians[0] > 0 else 0.0])
        local = torch.tensor(rows, dtype=torch.float64, device=self.device).view(
            len(self.dims), len(FIELDS))
        window, self.steps = len(self.steps), []
        self.comm.all_reduce(local)
        # the options' indices, then a status slot (FAILED: rank 0's decision raised)
        choice = torch.full((len(self.dims) + 1,), -1, dtype=torch.int64, device=self.device)
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                choice[:-1] = torch.tensor(self._decide(step, window, local.cpu()),
                                           dtype=torch.int64, device=self.device)
                choice[-1] = 0
            except Exception as e:  # broadcast the failure first: the others wait for it
                failure = e
                choice[-1] = FAILED
        self.comm.broadcast(choice, 0)
        if failure is not None:
            raise failure
        indices = choice.tolist()  # the re-check's one host read
        if indices[-1] == FAILED:
            raise RecheckFailed(
                f"compression=auto: rank 0's re-check after step {step} failed (its log "
                "names the error); this rank stops with it rather than train on a scheme "
                "the ranks may not share")
        switches = {}
        for i, dim in enumerate(self.dims):
            index = indices[i]
            if index >= 0:
                label = self.tables[dim].options[index].label
                if label != self.current[dim]:
                    switches[dim] = label
                    self._apply(dim, label)
        if switches:
            self.log(f"[neoxlab] compression=auto: after step {step} switched "
                     + ", ".join(f"{d} {self.current[d]} -> {c}" for d, c in switches.items()),
                     flush=True)
            self.current.update(switches)
        return switches

    def _decide(self, step: int, steps: int, summed: torch.Tensor) -> list[int]:
        """Rank 0: the re-check on the mean over ranks of their median steps (`summed`, on
        the host); the options' indices."""
        measured = {}
        for i, dim in enumerate(self.dims):
            comm, codec, nbytes, ranks = summed[i].tolist()
            if ranks > 0:
                measured[dim] = Measured(comm / ranks, codec / ranks, nbytes / ranks)
        decision = self.state.check(step, measured)
        record = decision.record()
        record["steps"] = steps
        record["scheme"] = dict(self.state.current)
        with (self.run_dir / RECORD_FILE).open("a") as f:
            f.write(json.dumps(record) + "\n")
        return [[o.label for o in self.tables[d].options].index(self.state.current[d])
                for d in self.dims]

    def _apply(self, dim: str, label: str) -> None:
        s = self.tables[dim].option(label).setting
        self.patch.switch(dim, DimCompression(make_compressor({"name": s["compressor"],
                                                          **s["params"]}),
                                         s["min_bytes"], s["error_feedback"]))
