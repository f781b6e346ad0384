"""A rank's GPU under each launcher, chosen once (neoxlab.run.device) for training, serving
and the GPT-NeoX entry: the launcher's environment is patched in, and torch.cuda's device
count and set_device are stand-ins that fail as CUDA does on an ordinal nothing shows."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from neoxlab.compress import kernels as codec_kernels
from neoxlab.config.compose import compose_experiment
from neoxlab.layout import resolve_layout
from neoxlab.run import device
from neoxlab.run.device import LAUNCHER_LOCAL_RANK_VARS, NODE_LOCAL_RANK_ENV

# What each launcher exports on the third rank of a 4-GPU node (node-local rank 2), and how
# many GPUs that rank sees. dist.discover has exported MPI's node-local rank as LOCAL_RANK.
LAUNCHERS = {
    "jsrun -g 1 -a 1": ({"JSM_NAMESPACE_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
                         "CUDA_VISIBLE_DEVICES": "2"}, 1, 0),
    "srun --gpus-per-task=1": ({"SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "2"}, 1, 0),
    "srun, whole node visible": ({"SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                                 4, 2),
    "mpiexec (hydra)": ({"MPI_LOCALRANKID": "2"}, 4, 2),
    "mpiexec inside salloc": ({"MPI_LOCALRANKID": "2", "SLURM_LOCALID": "0"}, 4, 2),
    "mpirun_rsh (MVAPICH2)": ({"MV2_COMM_WORLD_LOCAL_RANK": "2"}, 4, 2),
    "jsrun -a 2 -g 2": ({"JSM_NAMESPACE_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3"},
                        2, 1),
}


class FakeCuda:
    """torch.cuda's device count and set_device for a process that sees `visible` GPUs."""

    def __init__(self, visible: int):
        self.visible, self.current = visible, None

    def set_device(self, index) -> None:
        index = torch.device(index).index if not isinstance(index, int) else index
        if not 0 <= index < self.visible:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index


@pytest.fixture
def launcher_env(monkeypatch):
    """Set a launcher's variables (and the count of visible GPUs) for one test."""
    for name in (*LAUNCHER_LOCAL_RANK_VARS, "LOCAL_RANK", NODE_LOCAL_RANK_ENV,
                 "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)

    def start(name: str) -> FakeCuda:
        env, visible, _ = LAUNCHERS[name]
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        local = next(v for k, v in env.items() if k in LAUNCHER_LOCAL_RANK_VARS)
        monkeypatch.setenv("LOCAL_RANK", local)  # what dist.discover exported
        fake = FakeCuda(visible)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.visible)
        monkeypatch.setattr(torch.cuda, "set_device", fake.set_device)
        # a V100 (the codec kernel choice asks the visible GPU's compute capability)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
        monkeypatch.setattr(codec_kernels, "_DECISIONS", {})  # the fake GPU's stay here
        return fake

    return start


def _deepspeed_local_rank() -> int:
    """DeepSpeed's own engine set-up steps that read the local rank (and assert that the
    Open MPI variable agrees with it)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    engine, args = SimpleNamespace(), SimpleNamespace(local_rank=None)
    DeepSpeedEngine._configure_with_arguments(engine, args, None)
    DeepSpeedEngine._do_args_sanity_check(engine, args)
    return engine.local_rank


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_each_launcher_gets_its_visible_gpu_and_deepspeed_agrees(launcher_env, launcher):
    fake = launcher_env(launcher)
    choice = device.select_device()
    expected = LAUNCHERS[launcher][2]
    assert (choice.index, fake.current) == (expected, expected)
    assert os.environ["LOCAL_RANK"] == str(expected)
    assert _deepspeed_local_rank() == expected
    again = device.select_device()  # idempotent: the node-local rank was kept aside
    assert again.index == expected and again.node_local_rank == choice.node_local_rank


def test_no_visible_gpu_is_refused_with_the_fix(launcher_env, monkeypatch):
    launcher_env("srun --gpus-per-task=1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="gpus-per-task=1"):
        device.select_device()


def test_a_bad_local_rank_variable_names_itself(monkeypatch):
    monkeypatch.setenv(NODE_LOCAL_RANK_ENV, "two")
    with pytest.raises(ValueError, match=f"{NODE_LOCAL_RANK_ENV}='two'"):
        device.node_local_rank()


@pytest.mark.parametrize("launcher", ["jsrun -g 1 -a 1", "srun, whole node visible"])
def test_builtin_training_starts_on_the_visible_gpu(launcher_env, launcher, monkeypatch):
    """train.program.init_distributed on a V100 cluster: set_device gets the visible GPU,
    and LOCAL_RANK (which DeepSpeed reads next) names the same one."""
    import deepspeed
    import torch.distributed.distributed_c10d as c10d
    from megatron.core import parallel_state

    from neoxlab.engines.builtin import program

    fake = launcher_env(launcher)
    started = {}
    monkeypatch.setattr(deepspeed, "init_distributed",
                        lambda **kw: started.update(kw, local_rank=os.environ["LOCAL_RANK"]))
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda **kw: None)
    monkeypatch.setattr(c10d, "default_pg_timeout", c10d.default_pg_timeout)
    cfg = compose_experiment("local_dp", ["cluster.device=v100"])
    program.init_distributed(cfg, resolve_layout(cfg))
    expected = LAUNCHERS[launcher][2]
    assert started["dist_backend"] == "nccl"
    assert fake.current == expected and started["local_rank"] == str(expected)


def test_gpt_neox_entry_places_the_rank_on_the_same_gpu(launcher_env):
    from neoxlab.engines.neox.entry import place_rank
    from neoxlab.run.dist import RankInfo

    fake = launcher_env("jsrun -g 1 -a 1")
    place_rank(RankInfo(rank=6, world_size=8, local_rank=2, master_addr="h", master_port=1))
    assert fake.current == 0 and os.environ["LOCAL_RANK"] == "0"
    assert os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] == "0"
    assert _deepspeed_local_rank() == 0


def test_cpu_training_leaves_the_device_and_local_rank_alone(monkeypatch):
    """cluster.device=cpu: no set_device, LOCAL_RANK as MPI exported it (the CPU path)."""
    import deepspeed
    from megatron.core import parallel_state

    from neoxlab.engines.builtin import program

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("set_device on CPU"))
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: None)
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda **kw: None)
    cfg = compose_experiment("local_dp", [])
    program.init_distributed(cfg, resolve_layout(cfg))
    assert os.environ["LOCAL_RANK"] == "3"


def test_every_rank_program_skips_deepspeeds_unused_shm_build(monkeypatch):
    """init_distributed marks DeepSpeed's shared-memory inference op unavailable before
    deepspeed.init_distributed, which would JIT-build it (~35 s of C++ on a fresh machine):
    rank programs without the compression patch (hf_rank.py, neox_equivalence_rank.py) too."""
    import deepspeed
    import deepspeed.ops
    from megatron.core import parallel_state

    from neoxlab.comm.install import SHM_COMM_OP
    from neoxlab.engines.builtin import program

    seen = {}
    monkeypatch.setattr(deepspeed.ops, "__compatible_ops__", {})
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: seen.update(
        compatible=deepspeed.ops.__compatible_ops__.get(SHM_COMM_OP)))
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda **kw: None)
    cfg = compose_experiment("local_dp", [])
    program.init_distributed(cfg, resolve_layout(cfg))
    assert seen == {"compatible": False}, seen
