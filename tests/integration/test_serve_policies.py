"""Every policy serves a Poisson trace with variable lengths token-for-token like sequential
and like transformers' generate on the same GPT-NeoX weights (decode attention through SDPA
and through the C++ kernel); reordering moves caches right; requests beyond the slots wait;
transformers' continuous batching support is detected."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.hf_cb import hf_cb_model, llama_twin, neox_cb_supported
from neoxlab.serve.hf_generate import neox_twin, run_hf_generate
from neoxlab.serve.policies import OWN_POLICIES, policy_for
from neoxlab.serve.scheduler import Sampling, ServeLoop
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import WorkloadSpec, make_workload
from tests.serve_tiny import kernel_calls

MAX_SEQ = 48
TINY = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
                   max_position_embeddings=64, vocab_size=200, rotary_pct=0.5)


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    torch.set_num_threads(1)
    init_single_process()
    yield
    shutdown()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random GPT-NeoX checkpoint dir (save_pretrained; nothing downloaded)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    m = TINY
    cfg = GPTNeoXConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, intermediate_size=4 * m.hidden_size,
        rotary_pct=m.rotary_pct, max_position_embeddings=m.max_position_embeddings,
        use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(11)
    model = GPTNeoXForCausalLM(cfg).float().eval()
    with torch.no_grad():  # non-trivial norms and biases and spread-out logits
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.mul_(5.0)
    path = tmp_path_factory.mktemp("hf_neox")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def trace():
    return make_workload(WorkloadSpec(10, "poisson", 0.003, (3, 9), (4, 24), TINY.vocab_size, 7))


def _serve(model, name, requests, slots=6, max_concurrent=None, sampling=None):
    policy = policy_for(name, max_concurrent or slots, 0.005)
    return ServeLoop(model, policy, slots, MAX_SEQ, sampling or Sampling()).run(requests)


def test_every_policy_matches_sequential_and_transformers_generate(hf_dir, trace, monkeypatch):
    from transformers import GPTNeoXForCausalLM

    model = build_serve_model(TINY, f"hf:{hf_dir}", 1, 1, 0, MAX_SEQ)
    calls = kernel_calls(monkeypatch)
    runs = {name: _serve(model, name, trace) for name in OWN_POLICIES}
    # 10 slots: decode steps of 8+ rows, which run on the prepacked weights (serve.packed_linear)
    runs["fused, 10 slots"] = _serve(model, "fused", trace, slots=10)
    assert model.packed.packs, "the prepacked products were not used"
    assert calls == []  # SDPA so far
    assert model.use_native_attention(True) == "native"  # the C++ decode attention
    # each request's tokens after its first are decode rows, attended once per layer; rows of
    # finished requests inside the span (no reordering) are computed too (wasted)
    decoded = sum(r.max_new_tokens - 1 for r in trace)
    for name in ("fused", "fused_noreorder", "sequential"):
        label = f"{name}, native attention"
        before = len(calls)
        runs[label] = _serve(model, name, trace)
        rows, wasted = calls[before:], runs[label].wasted_rows
        # every decode row went through the kernel
        assert sum(rows) == (decoded + wasted) * TINY.num_layers, (label, rows, wasted)
        assert (max(rows) > 1) == (name != "sequential"), (label, rows)  # rows shared steps
    model.use_native_attention(False)
    expected = [r["tokens"] for r in runs["sequential"].records]
    assert [len(t) for t in expected] == [r.max_new_tokens for r in trace]
    for name, run in runs.items():
        assert [r["tokens"] for r in run.records] == expected, name
    assert runs["fused"].wasted_rows == 0
    assert runs["fused"].steps < runs["sequential"].steps  # requests really shared steps
    hf = GPTNeoXForCausalLM.from_pretrained(hf_dir).float().eval()
    for req, tokens in zip(trace, expected, strict=True):
        out = hf.generate(torch.tensor([req.prompt]), max_new_tokens=req.max_new_tokens,
                          min_new_tokens=req.max_new_tokens, do_sample=False)
        assert out[0, len(req.prompt):].tolist() == tokens, req.rid
    # the hf_generate policy's twin, copied from our weights, is that same network
    twin = neox_twin(model)
    baseline = run_hf_generate(twin, trace, Sampling())
    assert [r["tokens"] for r in baseline.records] == expected
    padded = replace(trace[0], prompt=[0, *trace[0].prompt, 0])  # generate's pad id inside
    ours = _serve(model, "sequential", [padded]).records[0]["tokens"]
    assert run_hf_generate(twin, [padded], Sampling()).records[0]["tokens"] == ours


def test_lean_path_and_batched_prompts_equal_megatron_layers_one_by_one(trace):
    """The lean TP=1 path and a batched, right-padded prompt phase fill the same caches and
    give the same logits as megatron's layers prefilling one request at a time."""
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    prompts = [r.prompt for r in trace[:5]]
    assert len({len(p) for p in prompts}) > 1  # padding is exercised
    model.lean = False
    single = model.new_cache(5, MAX_SEQ)
    ref = torch.stack([model.prefill([p], [i], single)[0] for i, p in enumerate(prompts)])
    model.lean = True
    batched = model.new_cache(5, MAX_SEQ)
    slots = [3, 0, 4, 1, 2]  # any slots, not just a contiguous range
    got = model.prefill(prompts, slots, batched)
    for row, slot in enumerate(slots):
        torch.testing.assert_close(got[row], ref[row], rtol=1e-4, atol=1e-5)
        for a, b in zip(batched.slot_content(slot, len(prompts[row])),
                        single.slot_content(row, len(prompts[row])), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    runs = {}
    for lean in (True, False):
        model.lean = lean
        runs[lean] = [r["tokens"] for r in _serve(model, "fused", trace).records]
    assert runs[True] == runs[False]


def test_reordering_moves_cache_content_correctly(trace):
    """Step both fused policies together; each live request's cache must be identical."""
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    burst = [replace(r, arrival_s=0.0) for r in trace]  # same admissions under both policies
    loops = [ServeLoop(model, policy_for(n, 4, 0.0), 6, MAX_SEQ)
             for n in ("fused", "fused_noreorder")]
    for loop in loops:
        loop.begin(burst)
    moved, compared = 0, 0
    while True:
        running = [loop.tick() for loop in loops]
        assert running[0] == running[1]
        if not running[0]:
            break
        reo, plain = loops
        moved += sum(1 for s in reo.live.values() if s.slot != plain_slot(plain, s.req.rid))
        for slot, state in reo.live.items():
            other = plain_slot(plain, state.req.rid)
            length = reo.slot_pos[slot]
            assert length == plain.slot_pos[other]
            for a, b in zip(reo.cache.slot_content(slot, length),
                            plain.cache.slot_content(other, length), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            compared += 1
        lo, hi = reo.table.span()
        assert hi - lo == len(reo.live)
    assert moved > 0 and compared > 0  # the trace did exercise reordering
    assert [r["tokens"] for r in loops[0].end().records] == \
        [r["tokens"] for r in loops[1].end().records]


def plain_slot(loop: ServeLoop, rid: int) -> int:
    (slot,) = [s for s, st in loop.live.items() if st.req.rid == rid]
    return slot


def test_requests_beyond_the_slots_wait_instead_of_crashing(trace):
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    burst = [replace(r, arrival_s=0.0) for r in trace]
    run = _serve(model, "fused", burst, slots=2)
    assert len(run.records) == len(burst)
    events = sorted([(r["admit_s"], 1) for r in run.records] +
                    [(r["finish_s"], -1) for r in run.records], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    assert peak <= 2
    assert any(r["admit_s"] > 0.0 for r in run.records[2:])  # later ones waited
    with pytest.raises(ValueError, match="max_seq_len"):
        _serve(model, "fused", [replace(trace[0], max_new_tokens=MAX_SEQ)])


def test_sampling_is_per_request_and_eos_stops(trace):
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    sample = Sampling("sample", temperature=1.0, top_k=20)
    fused = _serve(model, "fused", trace, sampling=sample)
    seq = _serve(model, "sequential", trace, sampling=sample)
    assert [r["tokens"] for r in fused.records] == [r["tokens"] for r in seq.records]
    greedy = _serve(model, "sequential", trace)
    assert [r["tokens"] for r in fused.records] != [r["tokens"] for r in greedy.records]
    longest = max(greedy.records, key=lambda r: len(r["tokens"]))
    eos = longest["tokens"][len(longest["tokens"]) // 2]
    stopped = _serve(model, "fused", trace, sampling=Sampling(eos_token_id=eos))
    for full, cut in zip(greedy.records, stopped.records, strict=True):
        n = full["tokens"].index(eos) + 1 if eos in full["tokens"] else len(full["tokens"])
        assert cut["tokens"] == full["tokens"][:n]


def test_hf_cb_detects_gpt_neox_support_and_falls_back_to_a_matched_llama(hf_dir):
    """The probe must agree with a direct attempt on another GPT-NeoX; hf_cb then runs the
    same GPT-NeoX checkpoint when supported, else a Llama twin with matched parameters."""
    from transformers import GenerationConfig, GPTNeoXForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    neox = GPTNeoXForCausalLM.from_pretrained(hf_dir).float().eval()
    prompt = [5, 6, 7]
    ref = neox.generate(torch.tensor([prompt]), max_new_tokens=3, min_new_tokens=3,
                        do_sample=False)[0, 3:].tolist()
    try:
        out = neox.generate_batch(
            [prompt], generation_config=GenerationConfig(max_new_tokens=3, do_sample=False,
                                                         eos_token_id=-1, pad_token_id=0),
            continuous_batching_config=ContinuousBatchingConfig(
                num_blocks=8, page_size=16, max_batch_tokens=64), warmup=False)
        works = all(o.error is None and list(o.generated_tokens) == ref for o in out.values())
    except Exception:  # noqa: BLE001 - a crash is the unsupported case
        works = False
    assert neox_cb_supported() == works
    _, label = hf_cb_model(TINY, f"hf:{hf_dir}", 0)
    if works:
        assert label.startswith("gpt-neox")
    else:
        assert label.startswith("llama twin") and "unsupported" in label
    twin = llama_twin(TINY, 0)
    n_neox = sum(p.numel() for p in neox.parameters())
    n_twin = sum(p.numel() for p in twin.parameters())
    assert abs(n_twin - n_neox) / n_neox < 0.01


@pytest.mark.parametrize("packed_faster", [True, False])
def test_decode_steps_take_the_products_that_ran_their_batch_size_faster(
        trace, monkeypatch, packed_faster):
    """serve.packed_linear_timed: each decode row bucket's first step is run both ways and
    timed; the faster way is kept for that bucket, and tokens stay those of F.linear alone."""
    import itertools
    import types

    import torch.nn.functional as F

    from neoxlab.serve import model as serve_model
    from neoxlab.serve.packed_linear import TIMED_FROM, min_rows

    plain = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    plain.use_packed_linear(False)
    expected = [r["tokens"] for r in _serve(plain, "fused", trace, slots=10).records]
    # each choice reads 4 times: packed start, end, plain start, end
    ticks = [0, 1, 1, 3] if packed_faster else [0, 3, 3, 4]
    clock = itertools.chain.from_iterable(
        [t + 10 * k for t in ticks] for k in itertools.count())
    monkeypatch.setattr(serve_model, "time", types.SimpleNamespace(
        perf_counter=lambda: next(clock)))
    model = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    run = _serve(model, "fused", trace, slots=10)
    assert model.packing_pays and all(b >= TIMED_FROM for b in model.packing_pays)
    assert any(b < min_rows() for b in model.packing_pays)  # few-row buckets are timed too
    assert set(model.packing_pays.values()) == {packed_faster}
    assert (model.linear is model.packed_any) == packed_faster and model.linear is not None
    assert packed_faster or model.linear is F.linear
    assert [r["tokens"] for r in run.records] == expected
