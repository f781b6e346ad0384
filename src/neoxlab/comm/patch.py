"""Route the engines' collectives through compression, per parallel dimension.

Installed before deepspeed.init_distributed: DeepSpeed's TorchBackend caches some
torch.distributed functions when it is created, so it must cache our wrappers. Both
torch.distributed (Megatron calls it directly) and deepspeed.comm (DeepSpeed's modules) are
wrapped; a deepspeed.comm call reaches torch.distributed underneath, so the outer wrapper only
marks the call and the inner one acts, once.
"""

from __future__ import annotations

import functools
import inspect
import threading
from types import SimpleNamespace

import torch
import torch.distributed as dist

from neoxlab.comm import collectives as cc
from neoxlab.comm.accounting import Accountant
from neoxlab.comm.classify import Classifier
from neoxlab.comm.policy import DimPolicy

TORCH_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "broadcast", "send", "recv", "reduce_scatter", "all_to_all_single", "reduce",
             "isend", "irecv")
COMPRESSIBLE = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                "broadcast", "send", "recv"}
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SMALL_GROUP = 2  # all-gather-of-compressed beats the two-phase all-reduce up to this size


class _State(threading.local):
    busy = False
    via_deepspeed = 0


_state = _State()


class CompressionPatch:
    def __init__(self, policies: dict[str, DimPolicy], classifier: Classifier,
                 allreduce: str = "auto"):
        self.policies = policies
        self.classifier = classifier
        self.allreduce = allreduce
        self.accountant = Accountant()
        self.raw = SimpleNamespace()
        # Error-feedback residuals by gradient bucket: (order among this step's error-feedback
        # all-reduces, numel). Not by address: DeepSpeed reduces each step's buckets from
        # freshly allocated buffers, so an address never comes back (and a reused one may
        # belong to another bucket); the order of the buckets within a step is fixed.
        self.residuals: dict[tuple[int, int], torch.Tensor] = {}
        self._bucket = 0  # error-feedback all-reduces so far in this step
        self.installed: list[tuple[object, str, object]] = []

    # ---- training-loop hooks and checkpoint state ----------------------------------------
    def begin_step(self) -> None:
        """Called by the training loop before each step: bucket numbering starts over."""
        self._bucket = 0

    def state_dict(self) -> dict:
        """What a checkpoint must keep for training to continue bit for bit."""
        return {"residuals": {key: r.detach().cpu().clone() for key, r in self.residuals.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Residuals come back on the CPU; each moves to its bucket's device at first use."""
        self.residuals = {tuple(key): r for key, r in state["residuals"].items()}
        self._bucket = 0

    # ---- installation -------------------------------------------------------------------
    def install(self) -> CompressionPatch:
        for name in TORCH_OPS:
            original = getattr(dist, name)
            setattr(self.raw, name, original)
            self._replace(dist, name, self._torch_wrapper(name, original))
        try:
            import deepspeed.comm as ds_comm
        except ImportError:
            return self
        for name in TORCH_OPS:
            if hasattr(ds_comm, name):
                self._replace(ds_comm, name, _deepspeed_wrapper(getattr(ds_comm, name)))
        return self

    def uninstall(self) -> None:
        for module, name, original in reversed(self.installed):
            setattr(module, name, original)
        self.installed.clear()

    def _replace(self, module, name: str, wrapper) -> None:
        self.installed.append((module, name, getattr(module, name)))
        setattr(module, name, wrapper)

    def _torch_wrapper(self, name: str, original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if _state.busy:
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            _state.busy = True
            try:
                return self._handle(name, original, bound.arguments)
            finally:
                _state.busy = False

        return wrapper

    # ---- dispatch ------------------------------------------------------------------------
    def _handle(self, name: str, original, a: dict):
        tensor = _main_tensor(name, a)
        numel = tensor.numel() if tensor is not None else 0
        me = dist.get_rank()
        if name in ("send", "recv", "isend", "irecv"):
            peer = a.get("dst") if name in ("send", "isend") else a.get("src")
            dim = self.classifier.p2p(me, peer, numel)
            group_size = 2
            members = tuple(sorted((me, peer)))
        else:
            ranks = _group_ranks(a.get("group"))
            dim = self.classifier.collective(name, ranks, numel)
            group_size = len(ranks)
            members = tuple(sorted(ranks))
        policy = self.policies.get(dim)
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        compress = (
            policy is not None and policy.active and name in COMPRESSIBLE
            and tensor is not None and tensor.dtype in FLOATS and nbytes >= policy.min_bytes
            and not a.get("async_op", False) and group_size > 1 and _sum_op(name, a)
        )
        via_ds = _state.via_deepspeed > 0
        if not compress:
            cost = cc.Cost(bytes_out=nbytes)
            with cc._Timed(cost, "comm_s"):
                result = original(**a)
            self.accountant.record(dim, name, bytes_in=nbytes, bytes_out=nbytes,
                                   comm_s=cost.comm_s, group_size=group_size,
                                   via_deepspeed=via_ds, ranks=members)
            return result
        cost = getattr(self, f"_{name}")(policy, a, group_size)
        self.accountant.record(
            dim, name, bytes_in=nbytes, bytes_out=cost.bytes_out, comm_s=cost.comm_s,
            group_size=group_size, compressor=policy.compressor.describe(),
            compress_s=cost.compress_s, decompress_s=cost.decompress_s, via_deepspeed=via_ds,
            ranks=members,
        )
        return None

    # ---- compressed implementations (synchronous; async calls never get here) -------------
    def _all_reduce(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        x, group = a["tensor"], a["group"]
        residual = None
        if policy.error_feedback:
            key = (self._bucket, x.numel())
            self._bucket += 1
            residual = self.residuals.get(key)
            if residual is None or residual.shape != x.shape or residual.dtype != x.dtype:
                residual = self.residuals[key] = torch.zeros_like(x)
            elif residual.device != x.device:
                residual = self.residuals[key] = residual.to(x.device)
            x = x + residual
        algorithm = self.allreduce
        if algorithm == "auto":
            algorithm = "allgather" if n <= SMALL_GROUP else "alltoall"
        if algorithm == "allgather":
            result, cost = cc.all_reduce_allgather(self.raw, policy.compressor, x, group, n,
                                                   residual)
        else:
            result, cost = cc.all_reduce_alltoall(self.raw, policy.compressor, x, group, n,
                                                  residual)
        a["tensor"].copy_(result)
        return cost

    def _all_gather_into_tensor(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        parts, cost = cc.all_gather_tensor(self.raw, policy.compressor, a["input_tensor"],
                                           a["group"], n)
        a["output_tensor"].copy_(torch.cat([p.reshape(-1) for p in parts]).view_as(
            a["output_tensor"]))
        return cost

    def _all_gather(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        parts, cost = cc.all_gather_tensor(self.raw, policy.compressor, a["tensor"],
                                           a["group"], n)
        for out, part in zip(a["tensor_list"], parts, strict=True):
            out.copy_(part)
        return cost

    def _reduce_scatter_tensor(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        result, cost = cc.reduce_scatter(self.raw, policy.compressor, a["input"], a["group"], n)
        a["output"].copy_(result.view_as(a["output"]))
        return cost

    def _broadcast(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        result, cost = cc.broadcast(self.raw, policy.compressor, a["tensor"], a["src"],
                                    dist.get_rank(), a["group"])
        if result is not a["tensor"]:
            a["tensor"].copy_(result)
        return cost

    def _send(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        return cc.send(self.raw, policy.compressor, a["tensor"], a["dst"])

    def _recv(self, policy: DimPolicy, a: dict, n: int) -> cc.Cost:
        result, cost = cc.recv(self.raw, policy.compressor, a["tensor"], a["src"])
        a["tensor"].copy_(result)
        return cost


def _deepspeed_wrapper(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        _state.via_deepspeed += 1
        try:
            return original(*args, **kwargs)
        finally:
            _state.via_deepspeed -= 1

    return wrapper


def _main_tensor(name: str, a: dict) -> torch.Tensor | None:
    for key in ("tensor", "input_tensor", "input"):
        value = a.get(key)
        if isinstance(value, torch.Tensor):
            return value
    return None


def _group_ranks(group) -> frozenset[int]:
    if group is None or group is dist.GroupMember.WORLD:
        return frozenset(range(dist.get_world_size()))
    return frozenset(dist.get_process_group_ranks(group))


def _sum_op(name: str, a: dict) -> bool:
    """Only sums are compressed; MAX/MIN/PRODUCT reductions must stay exact."""
    if name not in ("all_reduce", "reduce_scatter_tensor"):
        return True
    return a.get("op", dist.ReduceOp.SUM) == dist.ReduceOp.SUM
