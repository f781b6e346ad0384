"""Validation: every bad layout is reported with its numbers and a fix, before anything starts."""

from __future__ import annotations

import pytest

from neoxlab.commands.check import check
from neoxlab.commands.plan import plan_run
from neoxlab.config import ConfigError
from neoxlab.config.compose import compose_experiment
from neoxlab.layout import (
    GIB,
    estimate_memory,
    padded_vocab_size,
    resolve_layout,
    total_params,
    validate,
)

BAD_LAYOUTS = [
    # (experiment, overrides, substrings every error message must contain)
    ("local_3d", ["parallel.tp=3"], ["num_attention_heads=4", "parallel.tp=3", "divisible"]),
    ("local_3d", ["cluster.ranks_per_node=6", "parallel.dp=2"], ["world size 6", "tp*pp*dp"]),
    ("local_3d", ["cluster.ranks_per_node=6"], ["world size 6", "not divisible by tp*pp=2*2=4"]),
    (
        "baseline_192gpu",
        ["parallel.tp=1", "parallel.pp=1", "launch.submit=false"],
        ["estimated memory per device", "16.0 GiB", "raise tp/pp"],
    ),
    ("local_3d", ["zero.stage=2"], ["zero.stage=2", "pipeline", "use zero.stage=1"]),
    ("local_3d", ["parallel.micro_batch=-1"], ["parallel.micro_batch=-1", ">= 1"]),
    ("local_3d", ["model.num_layers=1"], ["num_layers=1 < parallel.pp=2"]),
]


@pytest.mark.parametrize(("experiment", "overrides", "expected"), BAD_LAYOUTS)
def test_bad_layout_is_refused_with_its_numbers(experiment, overrides, expected, results_dir):
    cfg = compose_experiment(experiment, overrides)
    with pytest.raises(ConfigError) as info:
        plan_run(cfg, check(cfg), root=results_dir)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} missing from:\n{message}"
    assert "nothing started" in message
    assert not any(results_dir.rglob("*")), "a refused config must not create a run dir"


def test_unknown_key_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        compose_experiment("local_3d", ["+parallel.tensor_parallel=2"])
    assert "tensor_parallel" in str(info.value)


def test_all_violations_are_reported_together():
    """One bad value per rule family (tensor parallel, pipeline, ZeRO, device, data): each
    family's errors are in the one list, in the order of the rules."""
    cfg = compose_experiment("local_3d", ["parallel.tp=3", "model.num_layers=1", "zero.stage=2",
                                          "engine.backend=nccl", "data.source=file"])
    errors = validate(cfg)
    expected = [
        "world size 8 (cluster.nodes=1 x ranks_per_node=8) is not divisible by tp*pp=3*2=6",
        "model.num_attention_heads=4 is not divisible by parallel.tp=3",
        "MLP width 256 is not divisible by tp=3",
        "model.num_layers=1 < parallel.pp=2",
        "zero.stage=2 with parallel.pp=2",
        "engine.backend='nccl' needs GPUs but cluster.device='cpu'",
        "data.source='file' needs data.path",
    ]
    assert len(errors) == len(expected), errors
    for error, text in zip(errors, expected, strict=True):
        assert text in error, (text, errors)


def test_dp_is_inferred_and_batch_identity_holds():
    cfg = compose_experiment("local_3d")
    layout = resolve_layout(cfg)
    assert (layout.tp, layout.pp, layout.dp) == (2, 2, 2)
    assert layout.global_batch == layout.micro_batch * layout.grad_accum * layout.dp


def test_20b_vocabulary_and_parameter_count():
    cfg = compose_experiment("baseline_192gpu", ["launch.submit=false"])
    assert padded_vocab_size(cfg.model, 4) == 50432  # the published rows, at our TP 4
    published = compose_experiment("baseline_192gpu", ["model.make_vocab_size_divisible_by=128"])
    assert padded_vocab_size(published.model, 2) == 50432  # configs/20B.yml: 128 x TP 2
    # GPT-NeoX-20B has about 20.6e9 parameters
    assert 20.0e9 < total_params(cfg.model, 2) < 21.0e9


def test_memory_estimate_shrinks_with_model_parallelism_and_zero():
    cfg = compose_experiment("baseline_192gpu", ["launch.submit=false"])
    layout = resolve_layout(cfg)
    est = estimate_memory(cfg, layout)
    assert est.total < cfg.cluster.device_memory_gib * GIB
    cfg.zero.stage = 0
    assert estimate_memory(cfg, layout).optimizer == pytest.approx(est.optimizer * layout.dp)
