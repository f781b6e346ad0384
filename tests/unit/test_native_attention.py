"""serve.native_attention: the C++ decode-attention kernel gives SDPA's result (causal bias,
each row up to its own position) on strided cache views, refuses what it cannot run, and a
model whose kernel cannot be built keeps SDPA and says why."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neoxlab.serve import native_attention
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.workload import WorkloadSpec, make_workload
from tests.serve_tiny import MAX_SEQ, greedy_tokens, kernel_calls, tiny_model

# the first build on a machine compiles the kernel (~30 s); later ones load the cached build
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built():
    if not native_attention.build():
        pytest.fail(f"the kernel did not build: {native_attention.unavailable()}")


def _sdpa(q, k, v, positions):
    keys = k.shape[2]
    causal = torch.full((keys, keys), float("-inf")).triu(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal[positions][:, None, None])


@pytest.mark.parametrize("rows, heads, d, keys", [(1, 4, 16, 1), (5, 4, 80, 33),
                                                  (32, 8, 64, 97)])
def test_the_kernel_equals_sdpa_over_strided_cache_views(built, rows, heads, d, keys):
    g = torch.Generator().manual_seed(rows + keys)
    qkv = torch.randn(rows, 1, heads, 3, d, generator=g)  # q as the QKV output's view
    q = qkv.transpose(1, 2).unbind(3)[0]
    cache_k = torch.randn(rows + 2, heads, keys + 9, d, generator=g)
    cache_v = torch.randn(rows + 2, heads, keys + 9, d, generator=g)
    k, v = cache_k[1:rows + 1, :, :keys], cache_v[1:rows + 1, :, :keys]
    positions = torch.randint(0, keys, (rows,), generator=g)
    positions[0] = keys - 1
    got = native_attention.decode_attention(q, k, v, positions)
    assert got.shape == (rows, heads, 1, d)
    torch.testing.assert_close(got, _sdpa(q, k, v, positions), rtol=1e-5, atol=1e-6)


def test_keys_beyond_a_rows_position_are_not_read(built):
    q, k, v = (torch.randn(2, 2, 1, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8))
    positions = torch.tensor([1, 4])
    before = native_attention.decode_attention(q, k, v, positions)
    k[0, :, 2:] = float("nan")  # row 0 sees keys 0..1 only
    v[0, :, 2:] = float("nan")
    after = native_attention.decode_attention(q, k, v, positions)
    torch.testing.assert_close(after, before)


@pytest.mark.parametrize("bad, match", [
    (lambda q, k, v, p: (q, k, v, torch.tensor([0, 6])), "position 6 outside the 6 keys"),
    (lambda q, k, v, p: (q.double(), k.double(), v.double(), p), "float32 only"),
    (lambda q, k, v, p: (q, k, v, p[:1]), "one position per row"),
])
def test_bad_input_is_refused_with_the_rule(built, bad, match):
    q, k, v = (torch.randn(2, 2, 1, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8))
    with pytest.raises(RuntimeError, match=match):
        native_attention.decode_attention(*bad(q, k, v, torch.tensor([0, 5])))


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    init_single_process()
    yield tiny_model()
    shutdown()


def test_fused_serving_on_the_kernel_gives_sdpas_tokens(built, model, monkeypatch):
    """The tokens match SDPA's, and the kernel really ran: on every decode step's rows when
    it is on (fused steps of several rows), never when it is off."""
    spec = WorkloadSpec(6, "poisson", 0.001, (3, 9), (4, 12), 200, 5)
    calls = kernel_calls(monkeypatch)
    counted_before = native_attention.calls  # summary.json's decode_attention_calls
    tokens, rows = {}, {}
    for on in (False, True):
        assert model.use_native_attention(on) == ("native" if on else "sdpa")
        for p in ("fused", "sequential"):
            before = len(calls)
            tokens[on, p] = greedy_tokens(model, p, make_workload(spec), 3)
            rows[on, p] = calls[before:]
    model.use_native_attention(False)
    assert tokens[True, "fused"] == tokens[False, "fused"] == tokens[False, "sequential"]
    assert tokens[True, "sequential"] == tokens[False, "sequential"]
    assert all(len(t) >= 4 for t in tokens[True, "fused"])
    assert rows[False, "fused"] == rows[False, "sequential"] == []
    layers = model.config.num_layers
    # every decode step attends once per layer: sequential decodes 6 requests one at a time
    generated = sum(len(t) - 1 for t in tokens[True, "sequential"])  # the first is prefill's
    assert rows[True, "sequential"] == [1] * (generated * layers)
    assert sum(rows[True, "fused"]) == generated * layers
    assert max(rows[True, "fused"]) > 1  # fused steps of several rows went through it
    assert native_attention.calls - counted_before == len(calls)


def test_a_kernel_that_cannot_be_built_leaves_sdpa_and_says_why(model, monkeypatch):
    monkeypatch.setattr(native_attention, "_module", lambda: None)
    monkeypatch.setattr(native_attention, "_failure", ["OSError: no C++ compiler"])
    assert model.use_native_attention(True) == \
        "sdpa (native kernel not built: OSError: no C++ compiler)"
    assert model.native_attend is False
    cache = model.new_cache(2, MAX_SEQ)
    logits = model.decode(torch.tensor([3, 4]), torch.tensor([0, 0]), 0, cache)
    assert logits.shape == (2, 200) and torch.isfinite(logits).all()
