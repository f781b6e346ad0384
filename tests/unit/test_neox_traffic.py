"""GPT-NeoX's bytes per dimension as the comm accounting should hold them, from first
principles: what a GPT-NeoX pipeline send carries (DeepSpeed's partitioned activation, its
metadata, the fp16 attention mask), the TP all-reduces per stage, the token broadcast; and
the builtin engine's counts, which the GPT-NeoX terms must leave as they were.

Bytes are taken through studies/neox_predict_bytes.py's `predicted` (the model's messages
counted as the accounting records calls: every rank, both ends of a p2p) for a run dir
holding only config.json."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.config.schema import to_dict
from neoxlab.layout import estimate_memory, resolve_layout
from neoxlab.perfmodel import traffic
from neoxlab.perfmodel.predict import codec_for
from neoxlab.perfmodel.resolve import resolve_profile
from neoxlab.run.rundir import write_json

STUDY = Path(__file__).resolve().parents[2] / "studies" / "neox_predict_bytes.py"
_spec = importlib.util.spec_from_file_location("neox_predict_bytes", STUDY)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)

SEQ, HIDDEN, MICRO, ACCUM = 32, 48, 2, 3


def accounted(tmp_path: Path, exp: str, ranks: int, *overrides: str) -> dict[str, float]:
    """dim -> bytes of one step the model says the comm accounting records."""
    cfg = compose_experiment(exp, [
        f"cluster.ranks_per_node={ranks}", f"model.seq_length={SEQ}",
        f"model.max_position_embeddings={SEQ}", f"model.hidden_size={HIDDEN}",
        "model.num_attention_heads=2", f"parallel.micro_batch={MICRO}",
        f"parallel.grad_accum={ACCUM}", *overrides])
    write_json(tmp_path / "config.json", to_dict(cfg))
    return {dim: sum(ops.values()) for dim, ops in study.predicted(tmp_path, 1).items()}


def meta_bytes(tp: int) -> int:
    """DeepSpeed's PartitionedTensor.to_meta() of a [seq, micro, hidden] tensor in tp parts:
    [ndims, *shape, parts, rank, *bounds] as int64 (bounds: parts + 1)."""
    shape = [SEQ, MICRO, HIDDEN]
    numel = SEQ * MICRO * HIDDEN
    bounds = [i * numel // tp for i in range(tp + 1)]
    return 8 * len([len(shape), *shape, tp, 0, *bounds])


def test_a_gpt_neox_stage_boundary_carries_meta_a_tp_part_and_the_fp16_mask(tmp_path):
    # 8 ranks TP=2 x PP=2 x DP=2, fp32: per micro-batch forward (meta, part, mask), backward
    # (meta, part of the gradient); each send accounted by its sender and its receiver
    tp, pairs = 2, 2 * 2  # a stage pair per (data, model) coordinate
    part = SEQ * MICRO * HIDDEN // tp * 4
    mask = SEQ * SEQ * 2  # [1, 1, seq, seq] bool sent as half
    per_microbatch = (meta_bytes(tp) + part + mask) + (meta_bytes(tp) + part)
    got = accounted(tmp_path, "local_neox", 8)
    assert got["pp"] == pairs * ACCUM * 2 * per_microbatch


def test_without_tp_the_stage_boundary_carries_the_whole_activation_and_the_mask(tmp_path):
    act = SEQ * MICRO * HIDDEN * 4
    got = accounted(tmp_path, "local_neox", 2, "parallel.tp=1")  # PP=2 alone, DP=1
    assert got["pp"] == ACCUM * 2 * ((act + SEQ * SEQ * 2) + act)
    assert got.get("tp", 0) == 0


def test_gpt_neox_tp_bytes_count_each_stage_its_own_collectives(tmp_path):
    # TP=2 x PP=3, 4 layers (2, 1, 1): per layer 1 forward (parallel residual) + 2 backward
    # all-reduces; the embedding's forward on the first stage, the head's backward on the
    # last; the partitioned pipeline tensors all-gathered: input on stages > 0, output and
    # gradient on stages < last; the tokens broadcast on the first and last stage
    tp = 2
    act = SEQ * MICRO * HIDDEN * 4
    reduces = (2 * 3 + 1) + 1 * 3 + (1 * 3 + 1)
    gathers = 2 + 3 + 1
    tokens = MICRO * (SEQ + 1) * 8
    got = accounted(tmp_path, "local_neox", 6, "parallel.pp=3", "model.num_layers=4")
    assert got["tp"] == ACCUM * tp * (reduces * act + gathers * act / tp + 2 * tokens)
    # the cross entropy's fp32 statistics (last stage) and broadcast_data's int64 sizes
    # (first and last) go where the comm patch's classifier puts them: other, with the
    # step's 3 control scalars over the world
    statistics = 3 * MICRO * SEQ * 4
    assert got["other"] == ACCUM * tp * (statistics + 2 * 4 * 8) + 6 * 3 * 8


@pytest.mark.parametrize("pp", [1, 2])
def test_builtin_messages_stay_the_megatron_core_deepspeed_counts(pp):
    # the builtin engine's messages from the rules of perfmodel/traffic.py, written out:
    # its predictions must not move while the GPT-NeoX terms change
    cfg = compose_experiment("local_compare", [f"parallel.pp={pp}", "model.num_layers=4",
                                               "train.precision=fp16"])
    layout = resolve_layout(cfg)
    tp, dp = layout.tp, layout.dp
    layers = 4 // pp
    elems = layout.micro_batch * cfg.model.seq_length * cfg.model.hidden_size
    act, tokens = elems * 2, layout.micro_batch * cfg.model.seq_length
    expected = [
        traffic.Message("tp", "all_reduce", act, tp, layers * 2 + (pp == 1), "microbatch", 16),
        traffic.Message("tp", "all_reduce", act, tp, layers * 2 + 1, "microbatch", 16),
        traffic.Message("tp", "all_reduce", tokens * 4, tp, 3, "microbatch", 32),
    ]
    if pp > 1:
        expected += [traffic.Message("tp", "all_gather", act, tp, 2, "microbatch", 16),
                     traffic.Message("pp", "p2p", act / tp, 2, 2, "microbatch", 16)]
    params = estimate_memory(cfg, layout).params_per_device
    for dim, bucket_elems in (("dp", cfg.zero.reduce_bucket_size),
                              ("zero", cfg.zero.allgather_bucket_size)):
        op = "all_reduce" if dim == "dp" else "all_gather"
        full, rest = divmod(params * 2, bucket_elems * 2)
        if full:
            expected.append(traffic.Message(dim, op, bucket_elems * 2, dp, full, "step", 16))
        if rest:
            expected.append(traffic.Message(dim, op, rest, dp, 1, "step", 16))
    expected.append(traffic.Message("control", "all_reduce", 8, layout.world_size, 3, "step",
                                    32))
    assert traffic.messages(cfg, layout) == expected


def test_builtin_accounted_bytes_are_every_rank_of_every_group_times_its_calls(tmp_path):
    # TP=2 x PP=2 x DP=2, 4 layers (2 a stage), fp32: the builtin counts on every stage
    # (the busiest one's), a p2p on both ends of each of the 4 stage pairs
    got = accounted(tmp_path, "local_compare", 8, "model.num_layers=4")
    act = SEQ * MICRO * HIDDEN * 4
    per_rank_tp = (2 * 2 + 0) * act + (2 * 2 + 1) * act + 2 * act / 2
    assert got["tp"] == ACCUM * 8 * per_rank_tp
    assert got["pp"] == ACCUM * 4 * 2 * 2 * act / 2


DATA = Path(__file__).resolve().parents[2] / "docs/measurements/data/2026-12-07-neox-cpu"


@pytest.mark.parametrize("name", ["predict_bytes", "predict_bytes_pp2", "predict_bytes_tp2"])
def test_the_committed_gpt_neox_runs_match_the_model_within_5_percent(name, capsys):
    # issue 51's must-show, on the committed comparison the measurement page's table prints
    rows = {row["dim"]: row for row in study.json.loads((DATA / f"{name}.json").read_text())}
    moving = [dim for dim in study.DIMS if rows[dim]["measured_bytes"]]
    assert moving
    for dim in moving:
        assert abs(rows[dim]["measured_over_predicted"] - 1) < 0.05, dim
    assert study.main(["--from-data", str(DATA / f"{name}.json")]) == 0
    printed = capsys.readouterr().out
    assert all(f"{rows[dim]['measured_over_predicted']:7.3f}" in printed for dim in moving)


def test_integer_payloads_go_raw_and_the_fp16_mask_is_coded_at_its_width():
    # naive: ZFP rate 8 everywhere; the token ids and partition metadata are int64 (the patch
    # passes them raw), the mask is fp16 (rate 8: 2x), the activation fp32 (4x)
    cfg = compose_experiment("local_neox_naive", [])
    profile = resolve_profile(cfg).profile
    msgs = traffic.messages(cfg, resolve_layout(cfg))
    raw = [m for m in msgs if m.raw]
    assert {(m.dim, m.op) for m in raw} == {("tp", "broadcast"), ("pp", "p2p")}
    assert all(codec_for(cfg, profile, m, []) is None for m in raw)
    ratios = {m.float_bits: codec_for(cfg, profile, m, []).ratio
              for m in msgs if m.dim == "pp" and not m.raw}
    assert ratios == {32: 4.0, 16: 2.0}


def test_the_study_prints_the_same_table_from_its_json_as_from_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose_experiment("local_neox", [])
    write_json(run / "config.json", to_dict(cfg))
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    rows = [{"rank": 0, "dim": "tp", "op": "all_reduce", "bytes_in": 1000},
            {"rank": 0, "dim": "pp", "op": "send", "bytes_in": 300},
            {"rank": 1, "dim": "pp", "op": "recv", "bytes_in": 300},
            {"rank": 0, "dim": "other", "op": "broadcast", "bytes_in": 7}]
    (run / "comm.jsonl").write_text("".join(study.json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "predict_bytes.json"
    assert study.main([str(run), "--json", str(out)]) == 0
    from_run = capsys.readouterr().out
    assert study.main(["--from-data", str(out)]) == 0
    assert capsys.readouterr().out == from_run
    written = {row["dim"]: row for row in study.json.loads(out.read_text())}
    assert written["pp"]["measured_bytes"] == 600  # a send and its recv
    assert written["tp"]["predicted_bytes"] > 0 and written["pp"]["steps"] == 2
