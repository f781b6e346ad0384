"""Serving on the rank's device (cluster.device), proven on a CPU-only machine.

- Strict device: the serve program runs under torch's default device "meta", so a tensor
  made without naming its device lands on meta and the run fails; the run must complete
  with the tokens of an ordinary run (weights, cache and every per-step tensor beside each
  other, none on an implicit default).
- A GPU cluster: torch.cuda is faked available with one visible device, and a torch
  function mode sends whatever the program puts on CUDA to meta instead. The program must
  ask torch.distributed for NCCL, and place weights and KV cache on that device with the
  CPU-only fast paths off.
- A GPU asked for where torch sees none is refused, naming the value and the fix, before
  any process group starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from neoxlab.config.compose import compose_experiment
from neoxlab.run import device, dist
from neoxlab.run.device import NODE_LOCAL_RANK_ENV
from neoxlab.serve import native_attention, program
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import ServeLoop
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import load_traces

TINY = [
    "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4",
    "model.rotary_pct=0.5", "model.vocab_size=200", "serve.num_requests=4",
    "serve.output_len_min=3", "serve.output_len_max=6", "serve.prompt_len_min=2",
    "serve.prompt_len_max=5", "serve.max_seq_len=16", "serve.slots=4", "serve.mean_gap_ms=0",
    "serve.policies=[fused,sequential]", "logger.progress=false",
]
META = torch.device("meta")


def tiny(*overrides: str):
    return compose_experiment("flover_poisson", [*TINY, *overrides])


@pytest.fixture
def no_group():
    """No process group before the test; whatever it started is shut down after."""
    shutdown()
    yield
    shutdown()


def test_strict_device_serve_run_completes_with_the_tokens_of_an_ordinary_run(
        tmp_path: Path, no_group):
    cfg = tiny()
    init_single_process()
    with torch.device("meta"):  # what NEOXLAB_STRICT_DEVICE=1 makes the program do
        program.serve(cfg, tmp_path, 0, 1, None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device"] == "cpu"
    assert all(row["outputs_match"] for row in summary["policies"])
    records = [json.loads(line) for line in
               (tmp_path / "serve_results.jsonl").read_text().splitlines()]
    ((_, requests),) = load_traces(tmp_path / "workload.json")
    model = build_serve_model(cfg.model, "random", cfg.train.seed, 1, 0, cfg.serve.max_seq_len)
    ordinary = ServeLoop(model, policy_for("fused", 4, 0.0), 4, cfg.serve.max_seq_len).run(
        requests)
    expected = {r["rid"]: r["tokens"] for r in ordinary.records}
    assert {r["rid"]: r["tokens"] for r in records if r["policy"] == "fused"} == expected


class CudaAsMeta(TorchFunctionMode):
    """Within: what the code moves to or makes on a CUDA device lands on meta instead (this
    machine has no GPU); everything else runs as it would."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.device:  # the program names cuda:<i>; where it puts tensors moves
            return func(*args, **(kwargs or {}))
        args = tuple(_swap(a) for a in args)
        kwargs = {k: _swap(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def _swap(value):
    if isinstance(value, torch.device) and value.type == "cuda":
        return META
    if isinstance(value, str) and value.split(":")[0] == "cuda":
        return "meta"
    return value


class _Built(Exception):
    """Stops the program once its model is built (meta tensors cannot be served)."""


def test_gpu_cluster_places_weights_and_cache_on_the_rank_gpu_and_asks_for_nccl(
        tmp_path: Path, monkeypatch, no_group):
    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for name in ("LOCAL_RANK", NODE_LOCAL_RANK_ENV):  # select_device sets them
        monkeypatch.setenv(name, "0")
    backends: list[str] = []
    real_init = torch.distributed.init_process_group

    def init(backend=None, **_):
        backends.append(backend)  # gloo stands in for it: no NCCL without a GPU
        real_init("gloo", init_method=f"tcp://127.0.0.1:{dist.free_port()}", rank=0,
                  world_size=1)

    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    builds: list[int] = []  # the CPU-only kernel must not be built for a GPU run
    monkeypatch.setattr(native_attention, "build", lambda: builds.append(1) or False)
    built = {}

    def runner(model, *_):
        built["model"] = model
        raise _Built

    monkeypatch.setattr(program, "Runner", runner)
    cfg = tiny("cluster.device=v100", "cluster.gpus_per_node=1")
    with CudaAsMeta(), pytest.raises(_Built):
        program.serve(cfg, tmp_path, 0, 1, None)
    model = built["model"]
    assert backends == ["nccl"] and current and os.environ["LOCAL_RANK"] == "0"
    assert {t.device for t in [*model.parameters(), *model.buffers()]} == {META}
    assert model.new_cache(2, 8).k.device == META
    assert model.packed is None and not model.native_attend  # the CPU fast paths are off
    assert not builds


def test_backend_follows_the_device():
    assert device.backend_for(torch.device("cuda", 1)) == "nccl"
    assert device.backend_for(torch.device("cpu")) == device.backend_for("cpu") == "gloo"


def test_a_gpu_asked_for_where_torch_sees_none_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch, no_group):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda **_: pytest.fail("a process group started"))
    cfg = tiny("cluster.device=v100", "cluster.gpus_per_node=1")
    with pytest.raises(RuntimeError, match=r"cluster.device='v100'.*cluster.device=cpu"):
        program.serve(cfg, tmp_path, 0, 1, None)
    assert not list(tmp_path.iterdir())

