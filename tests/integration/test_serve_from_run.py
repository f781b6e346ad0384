"""Serving a training run's checkpoint (`serve.weights=run:<dir>`): a TP=2 x PP=2 x DP=2 run
trains a few steps (the session's `trained_3d`: local_compare's local_baseline member, shared
with the training and compression tests); served at TP=2 (a real 2-rank serve run) and at
TP=1 (in process), the model computes what transformers' GPTNeoXForCausalLM computes with
the checkpoint's weights, converted here independently of the loader. Damaged or foreign run
dirs are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from neoxlab.config import ConfigError, ModelConfig, from_dict
from neoxlab.engines.builtin import checkpoints
from neoxlab.serve.distributed import init_single_process, shutdown
from neoxlab.serve.weights import build_serve_model
from neoxlab.serve.workload import load_traces
from tests.integration.harness import CHECKPOINT_EVERY, TRAIN_STEPS, read_status, run_experiment

STEPS, EVERY = TRAIN_STEPS, CHECKPOINT_EVERY  # checkpoints after steps EVERY and STEPS
SERVE = [  # local_3d trains neox_tiny; serve must use the same model
    "model=neox_tiny", "serve.num_requests=5", "serve.prompt_len_min=2",
    "serve.prompt_len_max=6", "serve.output_len_min=3", "serve.output_len_max=10",
    "serve.max_seq_len=24", "serve.slots=4", "serve.mean_gap_ms=5",
    "serve.policies=[fused,sequential]",
]
REL_TOL = 1e-5  # fp32 on both sides; only summation order differs


def output(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(trained_3d: Path) -> Path:
    assert [c.step for c in checkpoints.usable(checkpoints.scan(trained_3d))] == [STEPS, EVERY]
    return trained_3d


@pytest.fixture(scope="module")
def run_config(trained: Path):
    cfg = from_dict(json.loads((trained / "config.json").read_text()))
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.cluster.ranks_per_node) == (2, 2, 8)
    return cfg


@pytest.fixture
def one_rank():
    torch.set_num_threads(1)
    init_single_process()
    yield
    shutdown()


def hf_from_checkpoint(step_dir: Path, m: ModelConfig, tp: int):
    """GPTNeoXForCausalLM holding the checkpoint's weights: the layer files read directly,
    shards joined the way megatron splits them (QKV and h->4h by rows, their outputs' dense
    layers by columns, vocab by rows; LayerNorms and output biases replicated)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    def shards(index: int) -> list[dict]:
        return [torch.load(step_dir / f"layer_{index:02d}-model_{r:02d}-model_states.pt",
                           weights_only=True) for r in range(tp)]

    def joined(parts: list[dict], key: str, dim: int) -> torch.Tensor:
        return torch.cat([p[key] for p in parts], dim=dim)

    state = {"gpt_neox.embed_in.weight": joined(shards(0), "word_embeddings.weight", 0)}
    for i in range(m.num_layers):
        parts, pre = shards(i + 1), f"gpt_neox.layers.{i}."
        for key in ("input_layernorm.weight", "input_layernorm.bias",
                    "post_attention_layernorm.weight", "post_attention_layernorm.bias",
                    "attention.dense.bias", "mlp.dense_4h_to_h.bias"):
            assert all(torch.equal(p[key], parts[0][key]) for p in parts), key
            state[pre + key] = parts[0][key]
        for key in ("attention.query_key_value.weight", "attention.query_key_value.bias",
                    "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias"):
            state[pre + key] = joined(parts, key, 0)
        for key in ("attention.dense.weight", "mlp.dense_4h_to_h.weight"):
            state[pre + key] = joined(parts, key, 1)
    norm = shards(m.num_layers + 1)[0]
    state["gpt_neox.final_layer_norm.weight"] = norm["norm.weight"]
    state["gpt_neox.final_layer_norm.bias"] = norm["norm.bias"]
    head = joined(shards(m.num_layers + 2), "final_linear.weight", 0)
    state["embed_out.weight"] = head
    state = {k: v[: m.vocab_size] if "embed" in k else v for k, v in state.items()}

    cfg = GPTNeoXConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, intermediate_size=m.ffn_mult * m.hidden_size,
        rotary_pct=m.rotary_pct, rotary_emb_base=m.rotary_emb_base,
        max_position_embeddings=m.max_position_embeddings, use_parallel_residual=True,
        hidden_act="gelu", layer_norm_eps=m.layernorm_eps, tie_word_embeddings=False,
        attn_implementation="eager", bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = GPTNeoXForCausalLM(cfg).float().eval()
    expected = set(model.state_dict())
    if "embed_out.weight" not in expected:  # transformers 5 names the head lm_head
        state["lm_head.weight"] = state.pop("embed_out.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    return model


@pytest.mark.timeout(1300)  # its set-up may make the session's local_compare run (<= 900 s)
def test_tp2_serve_run_from_checkpoint_generates_like_transformers(trained, run_config,
                                                                   tmp_path):
    proc, serve_dir = run_experiment("flover_tp2", tmp_path, *SERVE,
                                     f"serve.weights=run:{trained}", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert read_status(serve_dir)["state"] == "completed"
    summary = json.loads((serve_dir / "summary.json").read_text())
    assert summary["model"]["weights_source"].endswith(f"step {STEPS} (trained at tp=2)")
    ((_, requests),) = load_traces(serve_dir / "workload.json")
    records = [json.loads(x) for x in (serve_dir / "serve_results.jsonl").read_text().splitlines()]
    fused = {r["rid"]: r["tokens"] for r in records if r["policy"] == "fused"}
    assert len(fused) == len(requests)

    hf = hf_from_checkpoint(checkpoints.root(trained) / f"step{STEPS}", run_config.model, 2)
    for req in requests:
        out = hf.generate(torch.tensor([req.prompt]), max_new_tokens=req.max_new_tokens,
                          min_new_tokens=req.max_new_tokens, do_sample=False)
        assert out[0, len(req.prompt):].tolist() == fused[req.rid], req.rid


@pytest.mark.timeout(900)
def test_tp1_logits_equal_transformers_and_training_moved_the_weights(trained, run_config,
                                                                      one_rank):
    m = run_config.model
    served = build_serve_model(m, f"run:{trained}", run_config.train.seed, 1, 0, 32)
    hf = hf_from_checkpoint(checkpoints.root(trained) / f"step{STEPS}", m, 2)
    prompt = torch.randint(0, m.vocab_size, (1, 20), generator=torch.Generator().manual_seed(5))
    cache = served.new_cache(1, 32)
    for length in (1, 7, 20):
        ours = served.prefill([prompt[0, :length].tolist()], [0], cache)[0]
        with torch.no_grad():
            ref = hf(prompt[:, :length]).logits[0, -1]
        assert ours.shape == ref.shape == (m.vocab_size,)
        rel = ((ours - ref).abs().max() / ref.abs().max()).item()
        assert rel <= REL_TOL, (length, rel)

    untrained = build_serve_model(m, "random", run_config.train.seed, 1, 0, 32)
    moved = [(a - b).abs().max().item() for a, b in
             zip(served.parameters(), untrained.parameters(), strict=True)]
    assert min(moved) > 1e-5  # every tensor came from the checkpoint, not the seeded init


@pytest.mark.timeout(300)
def test_a_truncated_newest_checkpoint_falls_back_to_the_older_one(trained, run_config,
                                                                   tmp_path, one_rank):
    copy = shutil.copytree(trained, tmp_path / "run")
    layer = checkpoints.root(copy) / f"step{STEPS}" / "layer_01-model_01-model_states.pt"
    layer.write_bytes(layer.read_bytes()[:100])
    served = build_serve_model(run_config.model, f"run:{copy}", 1, 1, 0, 32)
    assert served.source == f"run:{copy} step {EVERY} (trained at tp=2)"


@pytest.mark.timeout(300)
def test_unservable_runs_are_refused_with_the_reason(trained, run_config, tmp_path, one_rank):
    from dataclasses import replace

    m = run_config.model
    with pytest.raises(ConfigError, match="not a run dir"):
        build_serve_model(m, f"run:{tmp_path}", 1, 1, 0, 32)
    with pytest.raises(ConfigError, match=r"num_attention_heads: run 4, serve 8"):
        build_serve_model(replace(m, num_attention_heads=8), f"run:{trained}", 1, 1, 0, 32)

    copy = shutil.copytree(trained, tmp_path / "run")
    cfg = json.loads((copy / "config.json").read_text())
    cfg["model"]["make_vocab_size_divisible_by"] = 512  # the run claims a different padding
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"256 rows.*pads vocab_size=256 to 1024"):
        build_serve_model(m, f"run:{copy}", 1, 1, 0, 32)

    for marker in checkpoints.root(copy).glob("step*/complete.json"):
        marker.unlink()
    with pytest.raises(ConfigError, match="no usable checkpoint.*no completion marker"):
        build_serve_model(m, f"run:{copy}", 1, 1, 0, 32)
