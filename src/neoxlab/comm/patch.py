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
from neoxlab.comm import strict
from neoxlab.comm.accounting import Accountant
from neoxlab.comm.classify import Classifier
from neoxlab.comm.scheme import DimCompression
from neoxlab.comm.side_stream import SideStreams, caller_tensors
from neoxlab.comm.slow_link import SlowLink

TORCH_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "broadcast", "send", "recv", "reduce_scatter", "all_to_all_single", "reduce",
             "isend", "irecv")
COMPRESSIBLE = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                "broadcast", "send", "recv", "reduce"}
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SMALL_GROUP = 2  # all-gather-of-compressed beats the two-phase all-reduce up to this size
SAMPLE_EVERY = 16  # uncompressed CUDA calls: one in this many is timed (events, no sync)
_CPU = torch.device("cpu")


class _State(threading.local):
    busy = False
    via_deepspeed = 0


_state = _State()


class CompressionPatch:
    def __init__(self, policies: dict[str, DimCompression], classifier: Classifier,
                 allreduce: str = "auto", strict: bool = False,
                 library: dict[str, str] | None = None, slow_link: SlowLink | None = None):
        self.policies = policies
        self.slow_link = slow_link  # compression.auto's testing stand-in for a slower link
        # dims whose traffic the MPI library compresses (compression.backend=mpi) -> label
        self.library = library or {}
        self.strict = strict  # strict-device mode (neoxlab.comm.strict)
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
        self._loss_scale: float | None = None  # fp16 loss scale the residuals are scaled by
        self._plain_calls: dict[tuple[str, str], int] = {}
        self._shrink: dict[tuple[object, torch.dtype], bool] = {}  # (codec, dtype) -> may shrink
        self.installed: list[tuple[object, str, object]] = []
        self.side = SideStreams()  # CUDA: compressed collectives overlap the caller's stream
        self.capture = None  # a comm.capture.Capture keeps messages for task=tune's proxy

    # ---- training-loop hooks and checkpoint state ----------------------------------------
    def begin_step(self, loss_scale: float | None = None) -> None:
        """Called before each step: bucket numbering starts over. With fp16 the gradients
        (hence the residuals) carry the loss scale; when it changes, the residuals are
        rescaled to the new one."""
        self._bucket = 0
        if loss_scale is None:
            return
        old, self._loss_scale = self._loss_scale, float(loss_scale)
        if old is not None and old != self._loss_scale:
            for residual in self.residuals.values():
                residual.mul_(self._loss_scale / old)

    def switch(self, dim: str, policy: DimCompression) -> None:
        """A dimension's codec from its next call on (compression=auto: between steps, at the
        same step on every rank). Error-feedback residuals stay only while the new policy
        feeds them back: another codec's residual is still error not yet sent."""
        self.policies[dim] = policy
        if dim == "dp" and not policy.error_feedback:
            self.residuals.clear()

    def state_dict(self) -> dict:
        """What a checkpoint must keep for training to continue bit for bit."""
        return {"residuals": {key: r.detach().cpu().clone() for key, r in self.residuals.items()},
                "loss_scale": self._loss_scale}

    def load_state_dict(self, state: dict) -> None:
        """Residuals come back on the CPU; each moves to its bucket's device at first use."""
        self.residuals = {tuple(key): r for key, r in state["residuals"].items()}
        self._loss_scale = state.get("loss_scale")  # the scale the residuals carry
        self._bucket = 0

    # ---- installation -------------------------------------------------------------------
    def install(self) -> CompressionPatch:
        for name in TORCH_OPS:
            original = getattr(dist, name)
            if self.slow_link is not None:
                original = self.slow_link.wrap(original)
            setattr(self.raw, name, original)
            self._replace(dist, name, self._torch_wrapper(name, original))
        if self.strict:
            self.raw = strict.checked(self.raw)
        try:
            # deferred: DeepSpeed is optional: patched only where the process has it
            import deepspeed.comm as ds_comm
            from deepspeed.runtime.engine import DeepSpeedEngine
        except ImportError:
            return self
        self._replace(DeepSpeedEngine, "_take_model_step",
                      self._after_model_step(DeepSpeedEngine._take_model_step))
        for name in TORCH_OPS:
            if hasattr(ds_comm, name):
                self._replace(ds_comm, name, _deepspeed_wrapper(getattr(ds_comm, name)))
        return self

    def _after_model_step(self, original):
        """Every DeepSpeed engine (neoxlab's and GPT-NeoX's) ends a step with its optimizer
        step: the next step starts there, with the loss scale the optimizer left."""
        patch = self

        @functools.wraps(original)
        def take_model_step(engine, *args, **kwargs):
            result = original(engine, *args, **kwargs)
            patch.begin_step(_loss_scale(engine))
            return result

        return take_model_step

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
            dim = self.classifier.p2p(me, peer, numel) if peer is not None else "other"
            group_size = 2
            members = tuple(sorted((me, peer)))
        else:
            ranks = _group_ranks(a.get("group"))
            shape = tuple(tensor.shape) if tensor is not None else ()
            dim = self.classifier.collective(name, ranks, numel, shape)
            group_size = len(ranks)
            members = tuple(sorted(ranks))
        policy = self.policies.get(dim)
        if self.capture is not None and group_size > 1 and _sum_op(name, a):
            self.capture.offer(dim, name, tensor)
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        # traffic the codec cannot shrink (zfp rate 24 on bf16: 3 bytes a value for 2) goes
        # through the engine's own call, accounted as raw (comm.install says so at start-up)
        compress = (
            policy is not None and policy.active and name in COMPRESSIBLE
            and tensor is not None and tensor.dtype in FLOATS and nbytes >= policy.min_bytes
            and group_size > 1 and _sum_op(name, a)
            and self._shrinks(policy, tensor.dtype)
        )
        via_ds = _state.via_deepspeed > 0
        if not compress:
            return self._plain(name, original, a, dim, nbytes, group_size, via_ds, tensor,
                               members)
        def compressed() -> cc.Cost:
            with strict.payload_device(tensor.device, self.strict):
                return getattr(self, f"_{name}")(policy, a, group_size)

        cost, work = self.side.run(tensor.device, compressed, caller_tensors(a),
                                   a.get("async_op", False))
        self.accountant.record(
            dim, name, bytes_in=nbytes, bytes_out=cost.bytes_out, comm_s=cost.comm_s,
            group_size=group_size, compressor=policy.compressor.describe(),
            compress_s=cost.compress_s, decompress_s=cost.decompress_s, via_deepspeed=via_ds,
            pending=cost, ranks=members, spans=cost.spans,
        )
        return work

    def _shrinks(self, policy: DimCompression, dtype: torch.dtype) -> bool:
        """Whether the dimension's codec may make messages of dtype smaller (the codec
        says; data-dependent codecs may), asked once per codec and dtype."""
        key = (policy.compressor, dtype)
        if key not in self._shrink:
            self._shrink[key] = policy.compressor.shrinks(dtype) is not False
        return self._shrink[key]

    def _plain(self, name: str, original, a: dict, dim: str, nbytes: int, group_size: int,
               via_ds: bool, tensor: torch.Tensor | None, members: tuple[int, ...]):
        """The engine's own call, untouched: no copy, no sync. CPU calls are timed by the
        host clock; CUDA calls by events on one call in SAMPLE_EVERY (scaled up)."""
        cuda = tensor is not None and tensor.device.type == "cuda"
        stats_key = (dim, name)
        self._plain_calls[stats_key] = calls = self._plain_calls.get(stats_key, 0) + 1
        if a.get("async_op", False) or (cuda and calls % SAMPLE_EVERY != 1):
            result = original(**a)
            self.accountant.record(dim, name, bytes_in=nbytes, bytes_out=nbytes, comm_s=0.0,
                                   group_size=group_size, via_deepspeed=via_ds, ranks=members,
                                   library=self.library.get(dim))
            return result
        cost = cc.Cost()
        with cc.Timed(cost, "comm_s", tensor.device if tensor is not None else _CPU):
            result = original(**a)
        self.accountant.record(dim, name, bytes_in=nbytes, bytes_out=nbytes,
                               comm_s=cost.comm_s, group_size=group_size,
                               via_deepspeed=via_ds, pending=cost,
                               weight=SAMPLE_EVERY if cuda else 1, ranks=members,
                               library=self.library.get(dim), spans=cost.spans)
        return result

    # ---- compressed implementations -----------------------------------------------------
    def _residual(self, policy: DimCompression, x: torch.Tensor) -> torch.Tensor | None:
        """This bucket's error-feedback residual (created at zero on first use)."""
        if not policy.error_feedback:
            return None
        key = (self._bucket, x.numel())
        self._bucket += 1
        residual = self.residuals.get(key)
        if residual is None or residual.shape != x.shape or residual.dtype != x.dtype:
            residual = self.residuals[key] = torch.zeros_like(x)
        elif residual.device != x.device:
            residual = self.residuals[key] = residual.to(x.device)
        return residual

    def _all_reduce(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        x = a["tensor"]
        algorithm = self.allreduce
        if algorithm == "auto":
            algorithm = "allgather" if n <= SMALL_GROUP else "alltoall"
        return cc.all_reduce(self.raw, policy.compressor, x, a["group"], n,
                             self._residual(policy, x), algorithm)

    def _reduce(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        x, group = a["tensor"], a["group"]
        ranks = sorted(_group_ranks(group))  # torch orders a group's ranks so
        dst = a["dst"] if a.get("group_dst") is None else ranks[a["group_dst"]]
        return cc.reduce(self.raw, policy.compressor, x, dst, ranks, dist.get_rank(), group,
                         self._residual(policy, x))

    def _all_gather_into_tensor(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        out = a["output_tensor"]
        x = a["input_tensor"]
        flat = out.view(-1) if out.is_contiguous() else out.reshape(-1)
        views = list(flat.split(x.numel()))
        cost = cc.all_gather_into(self.raw, policy.compressor, x, views, a["group"], n)
        if not out.is_contiguous():
            out.copy_(flat.view_as(out))
        return cost

    def _all_gather(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        return cc.all_gather_into(self.raw, policy.compressor, a["tensor"], a["tensor_list"],
                                  a["group"], n)

    def _reduce_scatter_tensor(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        return cc.reduce_scatter(self.raw, policy.compressor, a["input"], a["output"],
                                 a["group"], n)

    def _broadcast(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        return cc.broadcast(self.raw, policy.compressor, a["tensor"], a["src"],
                            dist.get_rank(), a["group"])

    def _send(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        return cc.send(self.raw, policy.compressor, a["tensor"], a["dst"], a.get("group"))

    def _recv(self, policy: DimCompression, a: dict, n: int) -> cc.Cost:
        return cc.recv(self.raw, policy.compressor, a["tensor"], a["src"], a.get("group"))


def _deepspeed_wrapper(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        _state.via_deepspeed += 1
        try:
            return original(*args, **kwargs)
        finally:
            _state.via_deepspeed -= 1

    return wrapper


def _loss_scale(engine) -> float | None:
    """The fp16 loss scale of a DeepSpeed engine (None under fp32/bf16)."""
    if not getattr(engine, "fp16_enabled", lambda: False)():
        return None
    getter = getattr(engine, "_get_optimizer_loss_scale", None)
    scale = getter() if getter is not None else None
    return float(scale) if scale is not None else None


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
    if name not in ("all_reduce", "reduce_scatter_tensor", "reduce"):
        return True
    return a.get("op", dist.ReduceOp.SUM) == dist.ReduceOp.SUM
