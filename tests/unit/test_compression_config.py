"""Compression schemes: bad settings are refused before launch; classification by ranks."""

from __future__ import annotations

import pytest

from neoxlab.comm.classify import Classifier, Grid
from neoxlab.comm.scheme import mpi_environment
from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config import ConfigError, DimCompressionConfig
from neoxlab.config.compose import compose_experiment

BAD_SCHEMES = [
    (["compression.dims.dp.compressor=zstd9"], ["compressor='zstd9'", "choose one of"]),
    (["compression.dims.dp.params.rate=0"], ["rate", "0"]),
    (["compression.dims.tp.compressor=zfp", "+compression.dims.tp.params.rate=8"],
     ["lossless_only", "tp"]),
    (["compression.dims.pp.min_bytes=-1"], ["min_bytes=-1", "negative"]),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_SCHEMES)
def test_bad_scheme_is_refused_before_launch(overrides, expected, results_dir):
    cfg = compose_experiment("local_mzhybrid", overrides)
    with pytest.raises(ConfigError) as info:
        plan_run(cfg, check(cfg), root=results_dir)
    for text in expected:
        assert text in str(info.value), str(info.value)
    assert not any(results_dir.rglob("*"))


def test_control_traffic_cannot_be_compressed():
    cfg = compose_experiment("local_mzhybrid")
    cfg.compression.dims["other"] = DimCompressionConfig(compressor="zfp", params={"rate": 8})
    with pytest.raises(ConfigError, match="'other'.*never compressed"):
        check(cfg)


def test_grid_matches_pipe_data_model_order():
    grid = Grid(tp=2, pp=2, dp=2)
    assert grid.coord(5) == (1, 0, 1)
    sets = grid.group_sets()
    assert sets[frozenset({0, 1})] == "tp"
    assert sets[frozenset({0, 2})] == "dp"
    assert sets[frozenset({1, 5})] == "pipe"


def test_classifier_by_ranks_and_op():
    c = Classifier(Grid(tp=2, pp=2, dp=2))
    big = 1024
    assert c.collective("all_reduce", frozenset({4, 5}), big) == "tp"
    assert c.collective("all_reduce", frozenset({4, 6}), big) == "dp"
    assert c.collective("all_gather_into_tensor", frozenset({4, 6}), big) == "zero"
    assert c.collective("broadcast", frozenset({4, 6}), big) == "other"
    assert c.collective("all_reduce", frozenset({0, 1, 4, 5}), big) == "other"  # pipe x model
    assert c.collective("all_reduce", frozenset({4, 6}), 1) == "other"  # a loss or a norm
    assert c.p2p(1, 5, big) == "pp"
    ce = Classifier(Grid(tp=2, pp=2, dp=2), hidden_size=64)
    assert ce.collective("all_reduce", frozenset({4, 5}), 512, (16, 32)) == "other"  # [s, b]
    assert ce.collective("all_reduce", frozenset({4, 5}), 2048, (32, 64)) == "tp"  # [sb, h]
    assert ce.collective("all_reduce", frozenset({4, 5}), 4096, (8, 8, 64)) == "tp"
    assert c.p2p(1, 4, big) == "other"


@pytest.mark.parametrize(("micro_batch", "seq", "hidden"), [(4, 64, 64), (64, 16, 64)])
def test_cross_entropy_statistics_stay_exact_when_shapes_coincide(micro_batch, seq, hidden):
    """A run's classifier (as install_for_run builds it) on TP=2: the per-token statistics
    [s, b] are control traffic even when b or s equals the hidden size; activations are TP."""
    from neoxlab.comm.install import install_for_run
    from neoxlab.layout import resolve_layout

    cfg = compose_experiment("local_mzhybrid", [
        f"parallel.micro_batch={micro_batch}", f"model.seq_length={seq}",
        f"model.hidden_size={hidden}", "model.num_attention_heads=4"])
    patch = install_for_run(cfg, resolve_layout(cfg))
    try:
        tp = frozenset({0, 1})
        classify = patch.classifier.collective
        s, b, h = seq, micro_batch, hidden
        for stats in [(s, b), (b, s)]:  # megatron-core [s, b]; GPT-NeoX's mpu [b, s]
            assert classify("all_reduce", tp, s * b, stats) == "other", stats
        assert classify("all_reduce", tp, s * b * h, (s, b, h)) == "tp"
        assert classify("all_reduce", tp, s * b * h, (s * b, h)) == "tp"
    finally:
        patch.uninstall()


MVAPICH = ["cluster.mpi_library=mvapich-plus", "+engine.group_backends.dp=mpi"]


def test_mpi_backend_renders_global_switches():
    cfg = compose_experiment("local_naive", ["compression.backend=mpi"])
    env = mpi_environment(cfg.compression)
    assert env["MPIR_CVAR_ENABLE_COMPRESSION"] == "1"
    assert env["MPIR_CVAR_COMPRESSION_ALGORITHM"] == "zfp"
    assert env["MPIR_CVAR_ZFP_RATE"] == "8"
    assert mpi_environment(compose_experiment("local_baseline",
                                              ["compression.backend=mpi"]).compression) == {}
    bad = compose_experiment("local_naive", ["compression.backend=mpi",
                                              "compression.dims.dp.compressor=int8",
                                              "compression.dims.dp.params={}"])
    with pytest.raises(ConfigError, match="supports only"):
        check(bad)


def test_mpi_backend_is_refused_where_the_library_cannot_compress():
    """mpich (the wheel here) has no on-the-fly compression: refused with the fix named,
    never run uncompressed under a compressed label."""
    cfg = compose_experiment("local_naive", ["compression.backend=mpi"])
    with pytest.raises(ConfigError, match=r"mpi_library='mpich' has none.*backend=framework"):
        check(cfg)
    quiet = compose_experiment("local_baseline", ["compression.backend=mpi"])
    check(quiet)  # nothing to compress: nothing runs under a false label


def test_mpi_backend_needs_compressed_dims_on_mpi_groups_with_one_setting():
    dp_only = ["compression=custom", "compression.backend=mpi"]  # zfp rate 8 on dp only
    with pytest.raises(ConfigError, match=r"error_feedback=true needs compression.backend="
                                          r"framework"):
        check(compose_experiment("local_3d", [*dp_only, *MVAPICH]))
    dp_only.append("compression.dims.dp.error_feedback=false")
    with pytest.raises(ConfigError, match=r"switches are global.*dp=zfp\{'rate': 8\}, "
                                          r"zero=none"):  # ZeRO all-gathers share dp groups
        check(compose_experiment("local_3d", [*dp_only, *MVAPICH]))
    zero_too = ["compression.dims.zero.compressor=zfp", "+compression.dims.zero.params.rate=8"]
    check(compose_experiment("local_3d", [*dp_only, *zero_too, *MVAPICH]))
    # dp compressed by the library, but its groups left on gloo
    with pytest.raises(ConfigError, match=r"dims.dp is to be compressed by the MPI library.*"
                                          r"engine.group_backends.dp=mpi"):
        check(compose_experiment("local_3d", [*dp_only, "cluster.mpi_library=mvapich-plus"]))
    # naive compresses tp too, whose groups run on gloo; zero (on the dp groups) has another
    # setting than dp would need if tp moved to MPI as well
    with pytest.raises(ConfigError, match=r"dims.tp is to be compressed by the MPI library"):
        check(compose_experiment("local_naive", ["compression.backend=mpi", *MVAPICH]))
    with pytest.raises(ConfigError, match=r"switches are global.*dp=zfp\{'rate': 8\}.*"
                                          r"zero=zfp\{'rate': 24\}"):
        check(compose_experiment("local_zhybrid", ["compression.backend=mpi", *MVAPICH,
                                                   "compression.dims.tp.compressor=none",
                                                   "compression.dims.pp.compressor=none"]))


def test_group_backends_are_validated():
    with pytest.raises(ConfigError, match=r"group_backends.zero: unknown dimension"):
        check(compose_experiment("local_3d", ["+engine.group_backends.zero=mpi"]))
    with pytest.raises(ConfigError, match=r"group_backends.dp='nccl' is not one of \['mpi'\]"):
        check(compose_experiment("local_3d", ["+engine.group_backends.dp=nccl"]))
    with pytest.raises(ConfigError, match="cluster.mpi_library='intelmpi' is not one of"):
        check(compose_experiment("local_3d", ["cluster.mpi_library=intelmpi"]))
    with pytest.raises(ConfigError, match=r"group_backends.pp: DeepSpeed's pipeline sends "
                                          r"activations with send/recv on the world group"):
        check(compose_experiment("local_3d", ["+engine.group_backends.pp=mpi"]))
    check(compose_experiment("local_3d", ["+engine.group_backends.dp=mpi",
                                          "+engine.group_backends.tp=mpi"]))


def test_library_switches_reach_the_ranks_only_when_the_library_compresses(tmp_path):
    from neoxlab.launch.ranks import rank_env

    on = compose_experiment("local_naive", ["compression.backend=mpi"])
    assert rank_env(on, tmp_path)["MPIR_CVAR_ENABLE_COMPRESSION"] == "1"
    for off in (compose_experiment("local_naive", []),
                compose_experiment("local_baseline", ["compression.backend=mpi"])):
        assert not any(k.startswith("MPIR_CVAR") for k in rank_env(off, tmp_path))


def test_ranks_refuse_library_compression_on_a_library_without_it():
    """The rank-side guard: the planning node may be told mvapich-plus while the ranks
    load another library (here the mpich wheel)."""
    from neoxlab.comm.install import MpiCompressionUnavailable, require_compressing_library

    with pytest.raises(MpiCompressionUnavailable, match=r"MPICH.*would not compress"):
        require_compressing_library({"MPIR_CVAR_ENABLE_COMPRESSION": "1"})


def test_rate_that_cannot_shrink_half_precision_traffic_is_refused():
    """A custom scheme with zfp rate 16 on bf16 activations would send every tp message raw:
    refused, with the fix named. The paper's ZHybrid keeps its published rate 24 (sent raw,
    skipped before encoding, counted)."""
    custom = ["compression=custom", "train.precision=bf16", "compression.dims.tp.compressor=zfp",
              "+compression.dims.tp.params.rate=16"]
    with pytest.raises(ConfigError, match=r"dims.tp.*zfp\(rate=16\).*bf16.*rate < 16"):
        check(compose_experiment("local_naive", custom))
    check(compose_experiment("local_naive", [*custom[:-1], "+compression.dims.tp."
                                                      "params.rate=8"]))
    check(compose_experiment("local_naive", custom[:1] + custom[2:]))  # fp32
    check(compose_experiment("local_naive", ["compression=zhybrid",
                                                      "train.precision=bf16"]))
