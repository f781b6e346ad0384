"""The compression patch in one process (a one-rank gloo group): what the `none` scheme
costs a collective, and how fp16 loss-scale changes reach the error-feedback residuals."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.patch import CompressionPatch
from neoxlab.comm.scheme import DimCompression
from neoxlab.compress import make_compressor


class OpLog(TorchDispatchMode):
    """Every aten/c10d operation dispatched inside the block: copies, allocations, kernels."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def ops_of(call) -> list[str]:
    log = OpLog()
    with log:
        call()
    return log.ops


def test_scheme_none_adds_no_copy_allocation_or_sync_to_a_collective(one_rank, monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    x = torch.randn(1 << 16)
    bare = {name: ops_of(call) for name, call in calls(x).items()}
    patch = CompressionPatch({}, Classifier(Grid(tp=1, pp=1, dp=1))).install()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU node
        patched = {name: ops_of(call) for name, call in calls(x).items()}
        stats = patch.accountant.stats
    finally:
        patch.uninstall()
    assert patched == bare  # not one extra aten op: no copy, no allocation
    assert all(ops for ops in bare.values())  # the log does see the collectives themselves
    assert syncs == []
    assert sum(s.calls for s in stats.values()) == len(bare)  # yet every call was counted


def calls(x: torch.Tensor) -> dict:
    out = [torch.empty_like(x)]
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "async_all_reduce": lambda: dist.all_reduce(x, async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather": lambda: dist.all_gather(out, x),
    }


def test_a_loss_scale_change_rescales_the_residuals():
    policy = DimCompression(make_compressor("zfp:rate=8"), 0, True)
    patch = CompressionPatch({"dp": policy}, Classifier(Grid(tp=1, pp=1, dp=2)))
    residual = patch._residual(policy, torch.zeros(1000, dtype=torch.float16))
    residual.copy_(torch.linspace(-1, 1, 1000, dtype=torch.float16))
    before = residual.clone()
    patch.begin_step(loss_scale=1024.0)
    patch.begin_step(loss_scale=1024.0)  # unchanged: untouched
    assert torch.equal(residual, before)
    patch.begin_step(loss_scale=512.0)  # an overflow halved the scale
    assert torch.equal(residual, before * 0.5)
    patch.begin_step()  # a step boundary without a scale (fp32/bf16): untouched
    assert torch.equal(residual, before * 0.5)
    assert patch._residual(policy, torch.zeros(1000, dtype=torch.float16)) is residual


def test_every_deepspeed_optimizer_step_advances_the_patch(monkeypatch):
    """engine=neox never calls begin_step itself: the patch hooks DeepSpeed's optimizer
    step, which every engine (neoxlab's pipeline, GPT-NeoX's) ends a training step with."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    steps = []
    monkeypatch.setattr(DeepSpeedEngine, "_take_model_step",
                        lambda engine, lr_kwargs=None: steps.append(engine.scale))

    class FakeEngine:  # the two things the hook reads from a DeepSpeed engine
        scale = 1024.0

        def fp16_enabled(self):
            return True

        def _get_optimizer_loss_scale(self):
            return self.scale

    policy = DimCompression(make_compressor("zfp:rate=8"), 0, True)
    patch = CompressionPatch({"dp": policy}, Classifier(Grid(tp=1, pp=1, dp=2))).install()
    try:
        engine = FakeEngine()
        residual = patch._residual(policy, torch.ones(64, dtype=torch.float16)).fill_(1.0)
        DeepSpeedEngine._take_model_step(engine, None)
        assert patch._bucket == 0  # the next step numbers its buckets from the start
        engine.scale = 256.0  # an overflow step lowered the scale twice
        DeepSpeedEngine._take_model_step(engine, None)
        assert steps == [1024.0, 256.0]
        assert torch.equal(residual, torch.full((64,), 0.25, dtype=torch.float16))
    finally:
        patch.uninstall()
