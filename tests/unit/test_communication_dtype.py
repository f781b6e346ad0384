"""A scheme's communication dtype (compression.communication_dtype) reaches DeepSpeed
(communication_data_type) and GPT-NeoX (fp32_allreduce), and is validated: the paper's fp32
MPI payloads under fp16 training are expressible, a bad value is refused."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.builtin.deepspeed_config import render
from neoxlab.engines.neox.render import render_neox_config
from neoxlab.layout import resolve_layout

FP16_FP32_PAYLOADS = ["train.precision=fp16", "compression.communication_dtype=fp32"]


def test_deepspeed_gets_the_communication_dtype_only_when_set():
    cfg = compose_experiment("local_zhybrid", FP16_FP32_PAYLOADS)
    assert render(cfg, check(cfg))["communication_data_type"] == "fp32"
    plain = compose_experiment("local_zhybrid", ["train.precision=fp16"])
    assert "communication_data_type" not in render(plain, check(plain))


def test_gpt_neox_gets_fp32_allreduce():
    overrides = ["engine=neox", "cluster.neox_dir=/opt/gpt-neox", *FP16_FP32_PAYLOADS]
    cfg = compose_experiment("hybrid_192gpu", overrides)
    r = render_neox_config(cfg, resolve_layout(cfg), None)
    assert r["fp32_allreduce"] is True and r["communication_data_type"] == "fp32"
    cfg = compose_experiment("hybrid_192gpu", [*overrides[:2], "train.precision=fp16",
                                               "compression.communication_dtype=fp16"])
    assert render_neox_config(cfg, resolve_layout(cfg), None)["fp32_allreduce"] is False


def test_bad_communication_dtype_is_refused():
    cfg = compose_experiment("local_zhybrid", ["compression.communication_dtype=fp8"])
    with pytest.raises(ConfigError, match=r"communication_dtype='fp8' is not one of"):
        check(cfg)


def test_mpi_library_compression_needs_fp32_payloads():
    mvapich = ["compression=custom", "compression.backend=mpi",
               "compression.dims.dp.error_feedback=false", "compression.dims.zero.compressor=zfp",
               "+compression.dims.zero.params.rate=8", "cluster.mpi_library=mvapich-plus",
               "+engine.group_backends.dp=mpi", "train.precision=fp16"]
    with pytest.raises(ConfigError, match=r"FLOAT \(fp32\) data only.*fp16.*"
                                          r"communication_dtype=fp32"):
        check(compose_experiment("local_3d", mvapich))
    check(compose_experiment("local_3d", [*mvapich, "compression.communication_dtype=fp32"]))
