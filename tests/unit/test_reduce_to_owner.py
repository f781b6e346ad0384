"""zero.reduce_to_owner: ZeRO-1/2 gradient partitions reduced to the rank that keeps them
(DeepSpeed's use_multi_rank_bucket_allreduce=false), refused where DeepSpeed cannot do it."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.engines.builtin.deepspeed_config import render


def test_deepspeed_reduces_partitions_to_owners_only_when_asked():
    cfg = compose_experiment("local_zhybrid", ["zero.reduce_to_owner=true"])
    assert render(cfg, check(cfg))["zero_optimization"]["use_multi_rank_bucket_allreduce"] is False
    plain = compose_experiment("local_zhybrid")
    assert "use_multi_rank_bucket_allreduce" not in render(plain, check(plain))["zero_optimization"]


@pytest.mark.parametrize("overrides", [["zero.stage=0"], ["zero.reduce_scatter=false"]])
def test_reduce_to_owner_needs_zero_1_or_2_with_reduce_scatter(overrides):
    cfg = compose_experiment("local_zhybrid", ["zero.reduce_to_owner=true", *overrides])
    with pytest.raises(ConfigError, match=r"zero.reduce_to_owner=true with zero.stage=.*"
                                          r"use zero.stage=1 zero.reduce_scatter=true"):
        check(cfg)


def test_reduce_to_owner_is_refused_for_gpt_neox():
    cfg = compose_experiment("hybrid_192gpu", ["engine=neox", "cluster.neox_dir=/opt/gpt-neox",
                                               "zero.reduce_to_owner=true"])
    with pytest.raises(ConfigError, match=r"reduce_to_owner=true with engine=neox"):
        check(cfg)


def test_a_compressed_reduce_to_owners_is_refused_on_nccl():
    """On a GPU cluster (NCCL), the owners' point-to-point payloads would each build a
    communicator per pair of ranks: refused with the reason and the fix."""
    cfg = compose_experiment("hybrid_192gpu", ["zero.reduce_to_owner=true"])
    with pytest.raises(ConfigError, match=r"reduce_to_owner=true with compressed dp "
                                          r"gradients on NCCL.*engine.group_backends.dp=mpi"):
        check(cfg)
    for fine in (["zero.reduce_to_owner=false"], ["+engine.group_backends.dp=mpi",
                                                  "cluster.mpi_library=mvapich2-gdr"]):
        check(compose_experiment("hybrid_192gpu", fine))
