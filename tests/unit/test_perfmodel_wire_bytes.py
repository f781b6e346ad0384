"""Predicted uplink payload per step on the emulated 2x2 cluster (TP=2 inside a node, DP=2
across the 2 nodes, ZeRO-1, fp32), checked against bytes worked out by hand from the
model's size (pure computation)."""

from __future__ import annotations

import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.config.profile import CodecProfile, PerfProfile
from neoxlab.layout import layer_params, padded_vocab_size
from neoxlab.perfmodel import traffic
from neoxlab.perfmodel.wire_bytes import uplink_payload_bytes

CODEC = CodecProfile(encode_gbs=1.0, decode_gbs=1.0, call_us=0.0)
PROFILE = PerfProfile(codecs={"int8": CODEC, "mpc": CodecProfile(
    encode_gbs=1.0, decode_gbs=1.0, call_us=0.0, ratio=1.6)})


def emulated_2x2(*dp: str):
    """emulated_2x2 with DP's compression set by `dp` overrides (none: uncompressed)."""
    extra = ["compression=per_dim", *[f"compression.dims.dp.{o}" for o in dp]] if dp else []
    cfg = compose_experiment("emulated_2x2", extra)
    assert (cfg.cluster.nodes, cfg.cluster.ranks_per_node) == (2, 2)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.zero.stage) == (2, 1, 1)
    assert set(traffic.wire_dtypes(cfg).values()) == {"fp32"}  # 4 bytes a value
    return cfg


def rank_params(cfg) -> int:
    """Parameters one rank holds: the layers and the embedding, split over TP=2."""
    m = cfg.model
    return (m.num_layers * layer_params(m) + padded_vocab_size(m, 2) * m.hidden_size) // 2


def by_hand(cfg, dp_ratio: float) -> dict[str, float]:
    grads = 4 * rank_params(cfg)
    # ranks 0, 1 on node 0 and 2, 3 on node 1; DP pairs (0, 2) and (1, 3) cross. A ring
    # all-reduce of 2 sends 2(n-1)/n = 1 of the gradients a rank, so 4 ranks send 4 x grads
    dp = 4 * grads / dp_ratio
    # ZeRO-1's all-gather of the updated parameters: each rank sends its half to the other
    zero = 4 * grads / 2
    # 3 scalar all-reduces (8 bytes) over the world ring 0-1-2-3: 2(n-1)/n = 1.5 of them a
    # rank, and 2 of the ring's 4 hops (1-2, 3-0) cross
    control = 4 * 3 * 8 * 1.5 * 2 / 4
    return {"tp": 0.0, "pp": 0.0, "dp": dp, "zero": zero, "control": control,
            "total": dp + zero + control}


def test_uncompressed_dp_and_zero_cross_the_uplinks_and_tp_stays_inside():
    cfg = emulated_2x2()
    assert uplink_payload_bytes(cfg, PROFILE) == pytest.approx(by_hand(cfg, 1.0))


def test_int8_on_dp_sends_a_byte_and_a_share_of_a_block_scale_per_fp32_gradient():
    cfg = emulated_2x2("compressor=int8")
    got = uplink_payload_bytes(cfg, PROFILE)
    ratio = 32 / (8 + 32 / 256)  # codes, and an fp32 scale per block of 256
    assert got == pytest.approx(by_hand(cfg, ratio))
    assert got["dp"] == pytest.approx(uplink_payload_bytes(emulated_2x2(), PROFILE)["dp"] / ratio)


def test_a_data_dependent_codec_shrinks_by_the_profiles_ratio():
    cfg = emulated_2x2("compressor=mpc")
    assert uplink_payload_bytes(cfg, PROFILE) == pytest.approx(by_hand(cfg, 1.6))


def test_messages_below_min_bytes_go_raw():
    cfg = emulated_2x2("compressor=int8", f"min_bytes={4 * rank_params(emulated_2x2()) + 1}")
    assert uplink_payload_bytes(cfg, PROFILE) == pytest.approx(by_hand(cfg, 1.0))
