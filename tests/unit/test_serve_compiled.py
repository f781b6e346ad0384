"""serve.compile_decode: decode steps on torch.compile's graphs, rows padded to a bucket,
give the eager step's logits and cache and the same greedy tokens as sequential serving;
the padding rows touch no other slot, and a growing key length compiles nothing new."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.workload import WorkloadSpec, make_workload
from tests.serve_tiny import MAX_SEQ, greedy_tokens, tiny_model

SLOTS = 3  # decode steps of 1, 2 and 3 rows: buckets 1, 2 and 4 (3 rows padded by one)

pytestmark = pytest.mark.timeout(120)  # compiling 3 buckets x 3 graphs: ~25 s, 3 s cached


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    init_single_process()
    m = tiny_model()
    graphs = counters["stats"]["unique_graphs"]
    assert m.use_compiled_decode(True, SLOTS) > 0
    assert counters["stats"]["unique_graphs"] - graphs == 3 * 3  # qkv, out, head per bucket
    yield m
    m.use_compiled_decode(False)
    shutdown()


def test_a_padded_step_equals_the_eager_step_and_leaves_other_slots_alone(model):
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(6, MAX_SEQ)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    tokens, positions = torch.tensor([5, 17, 160]), torch.tensor([5, 9, 2])
    compiled, graphs = model.compiled, counters["stats"]["unique_graphs"]
    out = {}
    for name, use in (("compiled", compiled), ("eager", None)):
        model.compiled = use
        c = model.new_cache(6, MAX_SEQ)
        c.k.copy_(cache.k)
        c.v.copy_(cache.v)
        out[name] = model.decode(tokens, positions, 1, c, 10), c  # slots 1-3, 4 rows padded
    model.compiled = compiled
    assert counters["stats"]["unique_graphs"] == graphs  # 3 rows ran on bucket 4's graphs
    (logits, got), (ref_logits, ref) = out["compiled"], out["eager"]
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.k, ref.k, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.v, ref.v, rtol=1e-4, atol=1e-5)
    for slot in (0, 4, 5):  # slot 4 would take the padding row's K/V if it leaked
        assert torch.equal(got.k[:, slot], cache.k[:, slot])
        assert torch.equal(got.v[:, slot], cache.v[:, slot])


def test_compiled_fused_serving_gives_sequential_tokens_without_recompiling(model):
    trace = make_workload(WorkloadSpec(10, "poisson", 0.003, (3, 9), (4, 24), 200, 7))
    compiled = model.compiled
    model.compiled = None
    expected = greedy_tokens(model, "sequential", trace, SLOTS)
    eager_fused = greedy_tokens(model, "fused", trace, SLOTS)
    model.compiled = compiled
    graphs = counters["stats"]["unique_graphs"]
    for name in ("fused", "fused_noreorder", "sequential"):
        assert greedy_tokens(model, name, trace, SLOTS) == expected, name
    assert eager_fused == expected
    assert counters["stats"]["unique_graphs"] == graphs  # other spans and rows: no new graph
