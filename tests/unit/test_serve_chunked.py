"""Chunked prefill (prompt pieces riding in the fused decode step's forward) gives the same
greedy tokens as sequential serving with a prompt phase, on the lean and on megatron's
path, with prompts split over several steps."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import Engine, Sampling
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import WorkloadSpec, make_workload

MAX_SEQ = 48
TINY = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
                   max_position_embeddings=64, vocab_size=200, rotary_pct=0.5)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    init_single_process()
    m = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    with torch.no_grad():  # spread-out logits: argmax ties would make equality luck
        for p in m.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    yield m
    shutdown()


def _tokens(model, name, requests, chunk, slots=6, sampling=None):
    engine = Engine(model, policy_for(name, slots, 0.005), slots, MAX_SEQ, sampling or Sampling(),
                    prefill_chunk=chunk)
    return engine, [r["tokens"] for r in engine.run(requests).records]


def test_chunked_prefill_equals_sequential(model):
    trace = make_workload(WorkloadSpec(10, "poisson", 0.003, (3, 9), (4, 24), 200, 7))
    burst = [replace(r, arrival_s=0.0) for r in trace]  # many pieces queue at once
    model.lean = True
    _, expected = _tokens(model, "sequential", trace, 0)
    for lean in (True, False):
        model.lean = lean
        for name in ("fused", "fused_noreorder", "sequential"):
            for chunk in (1, 4):  # every prompt (3-9 tokens) split over steps
                got = _tokens(model, name, trace, chunk)[1]
                assert got == expected, (lean, name, chunk)
        engine, got = _tokens(model, "fused", burst, 5, slots=3)  # requests wait for slots
        assert got == expected
        assert engine.result.moves > 0  # reordering moved caches meanwhile
    sample = Sampling("sample", temperature=1.0, top_k=20)
    model.lean = True
    assert _tokens(model, "fused", trace, 4, sampling=sample)[1] == \
        _tokens(model, "sequential", trace, 0, sampling=sample)[1]
