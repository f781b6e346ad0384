"""engine=neox start-up defects that need no GPT-NeoX checkout.

Local rank: DeepSpeed 0.19.8's own engine set-up is called, with each launcher's environment.
Fused kernels: validation and the rendered default against the cluster's modules.
Dataset helpers: the python3 the makefile finds is the job's interpreter.
Fatal exits: a bare exit() before train_iters is an error that carries the logs' tails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from types import SimpleNamespace

import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.engines.neox.data_helpers import build_environment, python_wrapper
from neoxlab.engines.neox.outcome import early_exit_error
from neoxlab.engines.neox.render import render_neox_config
from neoxlab.engines.neox.rules import validate_neox
from neoxlab.engines.neox.toolchain import toolchain_problem, torch_cxx_standard
from neoxlab.layout import resolve_layout
from neoxlab.run.device import (
    LAUNCHER_LOCAL_RANK_VARS,
    NODE_LOCAL_RANK_ENV,
    align_local_rank,
)

# What each launcher exports on the third rank of a node (node-local rank 2).
LAUNCHER_ENVS = {
    "jsrun": {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_RANK": "6",
              "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
    "srun": {"SLURM_LOCALID": "2", "SLURM_PROCID": "6", "SLURM_NTASKS": "8"},
    "mpiexec": {"MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4", "PMI_RANK": "6",
                "PMI_SIZE": "8"},
}


def _deepspeed_configures(args: SimpleNamespace) -> int:
    """DeepSpeed's own engine set-up steps that read the local rank (no model needed)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    engine = SimpleNamespace()
    DeepSpeedEngine._configure_with_arguments(engine, args, None)
    DeepSpeedEngine._do_args_sanity_check(engine, args)
    return engine.local_rank


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*LAUNCHER_LOCAL_RANK_VARS, "LOCAL_RANK", NODE_LOCAL_RANK_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_jsrun_environment_reproduces_deepspeeds_local_rank_assertion(clean_env):
    for name, value in LAUNCHER_ENVS["jsrun"].items():
        clean_env.setenv(name, value)
    clean_env.setenv("LOCAL_RANK", "0")  # what the entry set before: one GPU per rank
    with pytest.raises(AssertionError, match="OMPI_COMM_WORLD_LOCAL_RANK"):
        _deepspeed_configures(SimpleNamespace(local_rank=None))


@pytest.mark.parametrize("launcher", sorted(LAUNCHER_ENVS))
def test_every_launchers_local_rank_agrees_with_local_rank(clean_env, launcher):
    for name, value in LAUNCHER_ENVS[launcher].items():
        clean_env.setenv(name, value)
    changed = align_local_rank(0, 2)
    own = [name for name in LAUNCHER_LOCAL_RANK_VARS if name in LAUNCHER_ENVS[launcher]]
    assert changed == dict.fromkeys(own, "2")
    assert all(os.environ[name] == "0" for name in own)
    assert not [n for n in LAUNCHER_LOCAL_RANK_VARS if n not in own and n in os.environ]
    assert os.environ["LOCAL_RANK"] == "0" and os.environ[NODE_LOCAL_RANK_ENV] == "2"
    args = SimpleNamespace(local_rank=0)  # GPT-NeoX passes its neox_args.local_rank
    assert _deepspeed_configures(args) == 0 and args.local_rank == 0


def test_all_gpus_visible_keeps_the_node_local_rank(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    assert align_local_rank(2, 2) == {}
    assert _deepspeed_configures(SimpleNamespace(local_rank=None)) == 2


NEOX_20B = ["engine=neox", "cluster.neox_dir=/gpfs/me/gpt-neox",
            "data.path=/gpfs/me/data/pile_text_document", "data.vocab_file=/gpfs/me/tok.json"]
FUSION = "scaled_upper_triang_masked_softmax_fusion"
NEW_MODULES = "cluster.modules=[cuda/12.2.2,gcc/11.2.1]"


def test_installed_torch_compiles_extensions_as_cxx20():
    import torch.utils.cpp_extension as ext

    assert torch_cxx_standard() == "c++20"
    assert "-std=c++20" in open(ext.__file__).read()  # the source the standard was read from


def test_lassen_modules_cannot_build_fused_kernels_and_validation_says_how_to_fix():
    assert "gcc 8.3 (needs >= 10.0)" in toolchain_problem(["cuda/11.8.0", "gcc/8.3.1"])
    assert "cuda 11.8 (needs >= 12.0)" in toolchain_problem(["cuda/11.8.0", "gcc/8.3.1"])
    assert toolchain_problem(["cuda/12.2.2", "gcc/11.2.1"]) is None
    assert toolchain_problem([]) is None  # unknown toolchain: not judged
    cfg = compose_experiment("baseline_192gpu", [*NEOX_20B, f"+engine.neox_args.{FUSION}=true"])
    (error,) = [e for e in validate_neox(cfg) if FUSION in e]
    assert "gcc 8.3" in error and f"engine.neox_args.{FUSION}=false" in error
    assert "gcc >= 10 and cuda >= 12.0" in error
    newer = compose_experiment("baseline_192gpu", [*NEOX_20B, NEW_MODULES,
                                                   f"+engine.neox_args.{FUSION}=true"])
    assert validate_neox(newer) == []


def test_fused_softmax_default_is_what_the_clusters_modules_can_build():
    def rendered(overrides):
        cfg = compose_experiment("baseline_192gpu", [*NEOX_20B, *overrides])
        assert validate_neox(cfg) == []
        return render_neox_config(cfg, resolve_layout(cfg))

    assert rendered([])[FUSION] is False  # lassen: gcc 8.3.1 + CUDA 11.8
    assert rendered([NEW_MODULES])[FUSION] is True  # the published 20B setting
    assert rendered([f"+engine.neox_args.{FUSION}=false", NEW_MODULES])[FUSION] is False
    assert rendered([])["bias_gelu_fusion"] is True  # TorchScript: no host compiler


def test_makefile_python3_is_the_jobs_interpreter(tmp_path):
    wrapper = python_wrapper(tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    build_environment(tmp_path, env)
    build_environment(tmp_path, env)  # once more (rank 0, then the entry): no duplicates
    assert env["PATH"] == f"{wrapper.parent}:/usr/bin:/bin"
    assert env["MAKEFLAGS"] == f"LIBEXT={sysconfig.get_config_var('EXT_SUFFIX')}"
    out = subprocess.run(["python3", "-c", "import sys; print(sys.prefix)"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == sys.prefix


def _logs(tmp_path, rank0: str, mine: str | None = None):
    logs = {"rank0.log": tmp_path / "rank0.log"}
    logs["rank0.log"].write_text(rank0)
    if mine is not None:
        logs["rank1.log"] = tmp_path / "rank1.log"
        logs["rank1.log"].write_text(mine)
    return logs


def test_bare_exit_before_train_iters_is_an_error_with_the_last_log_lines(tmp_path):
    rank0 = "".join(f"line {i}\n" for i in range(50)) + (
        "ERROR: Optimizer is None. Either set the optimizer dict in your config\n")
    error = early_exit_error(None, 1, _logs(tmp_path, rank0, "rank 1 said little\n"),
                             100, stop_requested=False, exit_interval=None)
    assert "before finishing its train_iters=100 steps" in error and "rank 1" in error
    assert "ERROR: Optimizer is None" in error and "rank 1 said little" in error
    assert "line 31" in error and "line 30\n" not in error  # the last 20 lines of rank 0


def test_asked_for_exits_are_not_errors_but_nonzero_codes_are(tmp_path):
    logs = _logs(tmp_path, "Making C++ dataset helpers module failed, exiting.\n")
    assert early_exit_error(0, 0, logs, 100, stop_requested=True, exit_interval=None) is None
    assert early_exit_error(None, 0, logs, 100, stop_requested=False, exit_interval=50) is None
    failed = early_exit_error(1, 0, logs, 100, stop_requested=True, exit_interval=None)
    assert "exited with code 1" in failed and "helpers module failed" in failed
