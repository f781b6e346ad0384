"""Chunked prefill (prompt pieces riding in the fused decode step's forward) gives the same
greedy tokens as sequential serving with a prompt phase, on the lean and on megatron's
path, with prompts split over several steps."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import Sampling, ServeLoop
from neoxlab.serve.workload import WorkloadSpec, make_workload
from tests.serve_tiny import MAX_SEQ, tiny_model


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    init_single_process()
    m = tiny_model()
    yield m
    shutdown()


def _tokens(model, name, requests, chunk, slots=6, sampling=None):
    loop = ServeLoop(model, policy_for(name, slots, 0.005), slots, MAX_SEQ,
                     sampling or Sampling(), prefill_chunk=chunk)
    return loop, [r["tokens"] for r in loop.run(requests).records]


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
        loop, got = _tokens(model, "fused", burst, 5, slots=3)  # requests wait for slots
        assert got == expected
        assert loop.result.moves > 0  # reordering moved caches meanwhile
    sample = Sampling("sample", temperature=1.0, top_k=20)
    model.lean = True
    assert _tokens(model, "fused", trace, 4, sampling=sample)[1] == \
        _tokens(model, "sequential", trace, 0, sampling=sample)[1]
