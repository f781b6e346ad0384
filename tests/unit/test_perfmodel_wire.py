"""The dtype on the wire in the performance model: read per dimension from the config
through the engine record, it sets the bytes, the codec ratio and the codec time (pure
computation)."""

from __future__ import annotations

import dataclasses

import pytest

from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, LinkProfile, PerfProfile
from neoxlab.layout import resolve_layout
from neoxlab.perfmodel import costs, traffic
from neoxlab.perfmodel.predict import codec_for
from neoxlab.perfmodel.resolve import resolve_profile

# no latency, 1 GB/s: a message's wire time in ns is the bytes it puts through the link
BYTES_LINK = LinkProfile(latency_us=0.0, bandwidth_gbs=1.0)
CODEC = CodecProfile(encode_gbs=1.0, decode_gbs=1.0, call_us=0.0)
PROFILE = PerfProfile(codecs={"zfp": CODEC, "mpc": CODEC})


@pytest.fixture(scope="module")
def naive():
    return compose_experiment("naive_192gpu", ["task=predict"])


@pytest.fixture(scope="module")
def zhybrid():
    return compose_experiment("hybrid_192gpu", ["task=predict"])


def _largest(cfg, dim: str, dtypes: dict[str, str]) -> traffic.Message:
    msgs = traffic.messages(cfg, resolve_layout(cfg), dtypes)
    return max((m for m in msgs if m.dim == dim and m.op == "all_reduce"),
               key=lambda m: m.nbytes)


def _shrink(cfg, msg: traffic.Message) -> tuple[float, costs.Cost]:
    """Bytes through the link uncompressed / compressed, and the compressed cost."""
    plain = costs.plain(msg, BYTES_LINK)
    coded = costs.message_cost(msg, BYTES_LINK, codec_for(cfg, PROFILE, msg, []))
    return plain / coded.comm_s, coded


def test_fp32_wire_at_zfp_rate_8_shrinks_4x_and_fp16_2x(naive):
    fp32 = _largest(naive, "dp", {"dp": "fp32"})
    fp16 = _largest(naive, "dp", {"dp": "fp16"})
    assert fp32.float_bits == 32 and fp16.float_bits == 16
    assert fp32.nbytes == pytest.approx(2 * fp16.nbytes)  # the same gradients, twice the bytes
    shrink32, cost32 = _shrink(naive, fp32)
    shrink16, cost16 = _shrink(naive, fp16)
    assert shrink32 == pytest.approx(4.0)
    assert shrink16 == pytest.approx(2.0)
    # the codec reads and writes the wider values: twice the time per bucket
    assert cost32.codec_s == pytest.approx(2 * cost16.codec_s)


def test_zfp_rate_24_shrinks_fp32_by_a_third_and_cannot_shrink_fp16(zhybrid):
    fp32 = _largest(zhybrid, "tp", {"tp": "fp32"})
    fp16 = _largest(zhybrid, "tp", {"tp": "fp16"})
    shrink32, _ = _shrink(zhybrid, fp32)
    shrink16, cost16 = _shrink(zhybrid, fp16)
    assert shrink32 == pytest.approx(32 / 24)
    # sent raw on the plain collective, no encode: what the patch does (comm/patch.py)
    assert codec_for(zhybrid, PROFILE, fp16, []) is None
    assert shrink16 == pytest.approx(1.0) and cost16.codec_s == 0


def test_wire_dtypes_come_from_precision_communication_dtype_and_the_engine(naive):
    assert traffic.wire_dtypes(naive) == dict.fromkeys(("tp", "pp", "dp", "zero"), "fp16")
    comm32 = ["task=predict", "compression.communication_dtype=fp32"]
    builtin = compose_experiment("naive_192gpu", comm32)
    # DeepSpeed's communication_data_type: DP gradients only; megatron-core's TP stays fp16
    assert traffic.wire_dtypes(builtin) == {"tp": "fp16", "pp": "fp16", "dp": "fp32",
                                            "zero": "fp16"}
    neox = compose_experiment("naive_192gpu", [*comm32, "engine=neox"])
    # GPT-NeoX's fp32_allreduce (rendered with an fp32 communication dtype): TP in fp32 too
    assert traffic.wire_dtypes(neox) == {"tp": "fp32", "pp": "fp16", "dp": "fp32",
                                         "zero": "fp16"}
    tp, tp16 = _largest(neox, "tp", {}), _largest(builtin, "tp", {})
    assert tp.float_bits == 32 and tp.nbytes == pytest.approx(2 * tp16.nbytes)


def test_an_unknown_wire_dtype_is_a_clear_error(naive):
    with pytest.raises(ConfigError, match=r"wire dtype dp='fp8'.*dtypes"):
        traffic.wire_dtypes(naive, {"dp": "fp8"})


# ---- the MPI library's compression rules (profile data) ------------------------------------
MVAPICH = ["task=predict", "compression.backend=mpi", "cluster.mpi_library=mvapich-plus"]


@pytest.fixture(scope="module")
def lassen_profile(naive):
    return resolve_profile(naive).profile


def test_an_fp16_message_under_the_mvapich_rules_is_priced_uncompressed(naive, lassen_profile):
    library = compose_experiment("naive_192gpu", MVAPICH)
    fp16 = _largest(library, "dp", {"dp": "fp16"})
    notes: list[str] = []
    assert codec_for(library, lassen_profile, fp16, notes) is None
    assert costs.message_cost(fp16, BYTES_LINK, None).comm_s == costs.plain(fp16, BYTES_LINK)
    assert any("fp16 is not one of the types it compresses" in n for n in notes)
    # the same layout on the framework backend: our codecs take fp16 too
    assert codec_for(naive, lassen_profile, fp16, []).ratio == pytest.approx(2.0)
    # and the library takes the same gradients cast to fp32: rate 8 is 4x
    fp32 = _largest(library, "dp", {"dp": "fp32"})
    assert codec_for(library, lassen_profile, fp32, []).ratio == pytest.approx(4.0)


def test_the_library_compresses_point_to_point_from_its_threshold_and_no_reduce(lassen_profile):
    library = compose_experiment("naive_192gpu", MVAPICH)
    framework = compose_experiment("naive_192gpu", ["task=predict"])
    rules = lassen_profile.mpi_compression["mvapich-plus"]

    def p2p(nbytes: float) -> traffic.Message:
        return traffic.Message("pp", "p2p", nbytes, 2, 1, "microbatch", 32)

    small = p2p(rules.p2p_min_bytes / 2)
    coded = costs.message_cost(small, BYTES_LINK, codec_for(library, lassen_profile, small, []))
    assert coded.comm_s == costs.plain(small, BYTES_LINK) and coded.codec_s == 0
    ours = costs.message_cost(small, BYTES_LINK, codec_for(framework, lassen_profile, small, []))
    assert ours.comm_s < costs.plain(small, BYTES_LINK)  # our min_bytes is 4096
    big = p2p(rules.p2p_min_bytes * 2)
    assert codec_for(library, lassen_profile, big, []).ratio == pytest.approx(4.0)
    over = p2p(rules.p2p_max_bytes * 2)
    assert codec_for(library, lassen_profile, over, []) is None
    owners = traffic.Message("dp", "reduce_to_owners", 8e6, 12, 1, "step", 32)
    assert codec_for(library, lassen_profile, owners, []) is None  # MPI_Reduce: not listed
    assert codec_for(framework, lassen_profile, owners, []) is not None


def test_a_library_without_rules_in_the_profile_is_a_clear_error(lassen_profile):
    cfg = compose_experiment("naive_192gpu", MVAPICH)
    bare = dataclasses.replace(lassen_profile, mpi_compression={})
    msg = _largest(cfg, "dp", {"dp": "fp32"})
    with pytest.raises(ConfigError, match=r"no mpi_compression.mvapich-plus rules.*"
                                          r"configs/cluster/lassen.yaml"):
        codec_for(cfg, bare, msg, [])
