"""FLOPs and throughput formulas against hand-computed values."""

from __future__ import annotations

import pytest

from neoxlab.config.compose import compose_experiment
from neoxlab.metrics import flops_per_iteration, summarize, tflops_per_gpu


def test_20b_flops_per_iteration_matches_hand_computation():
    model = compose_experiment("baseline_192gpu", ["launch.submit=false"]).model
    # by hand: 24*4*1536*2048*44*6144^2 * (1 + 2048/36864 + 50432/(16*44*6144))
    base = 24 * 4 * 1536 * 2048 * 44 * 6144**2
    correction = 1 + 2048 / 36864 + 50432 / 4325376
    assert flops_per_iteration(model, 1536, 50432, True) == pytest.approx(base * correction)
    assert flops_per_iteration(model, 1536, 50432, True) == pytest.approx(5.35e17, rel=0.01)
    assert flops_per_iteration(model, 1536, 50432, False) == pytest.approx(5.35e17 * 3 / 4, 0.01)


def test_tflops_per_gpu_divides_by_time_and_world():
    assert tflops_per_gpu(8e12, 2.0, 4) == pytest.approx(1.0)


def test_summary_excludes_warmup_steps():
    records = [
        {"step": s, "iteration_s": t, "samples_per_s": 8 / t, "tokens_per_s": 1.0,
         "tflops_per_gpu": 1.0, "mfu": 0.1, "loss": 5.0 - s}
        for s, t in [(1, 10.0), (2, 8.0), (3, 1.0), (4, 1.0), (5, 3.0)]
    ]
    summary = summarize(records, warmup_steps=2)
    assert summary["median_iteration_s"] == 1.0
    assert summary["steady_steps"] == 3
    assert summary["final_loss"] == 0.0
