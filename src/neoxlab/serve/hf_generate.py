"""`hf_generate`: transformers' own `generate`, one request at a time, as a second
sequential baseline on the matched model.

At TP=1 the GPT-NeoX it runs holds the very weights our policies serve (copied from the
ServeModel: the parameter names differ only by prefix), so its greedy tokens must equal
ours and the runner checks that they do. It measures our per-token step against the
library's on the same network.
"""

from __future__ import annotations

import time

import torch

from neoxlab.serve.model import ServeModel
from neoxlab.serve.scheduler import PolicyRun, Sampling
from neoxlab.serve.workload import Request


def neox_twin(model: ServeModel):
    """A GPTNeoXForCausalLM with the ServeModel's config and weights (TP=1 only)."""
    # deferred: transformers is slow to import, only the HF policies need it
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    if model.tp != 1:
        raise ValueError(f"hf_generate copies a TP=1 model; this one has tp={model.tp}")
    m = model.config
    cfg = GPTNeoXConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        intermediate_size=m.ffn_mult * m.hidden_size, rotary_pct=m.rotary_pct,
        rotary_emb_base=m.rotary_emb_base, max_position_embeddings=m.max_position_embeddings,
        layer_norm_eps=m.layernorm_eps, use_parallel_residual=m.parallel_residual,
        hidden_act="gelu", tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    vocab = m.vocab_size
    state = {"gpt_neox.embed_in.weight": getattr(model, "0").word_embeddings.weight[:vocab]}
    for i, block in enumerate(model.blocks()):
        for key, tensor in block.state_dict().items():
            if key.endswith("_extra_state"):  # megatron bookkeeping, no weights
                continue
            state[f"gpt_neox.layers.{i}.{key}"] = tensor
    norm = getattr(model, str(m.num_layers + 1)).norm
    state["gpt_neox.final_layer_norm.weight"] = norm.weight
    state["gpt_neox.final_layer_norm.bias"] = norm.bias
    head = getattr(model, str(m.num_layers + 2)).final_linear.weight[:vocab]
    state["lm_head.weight"] = head
    with torch.device("cpu"):  # built on the host, then placed beside the ServeModel
        twin = GPTNeoXForCausalLM(cfg)
    missing, unexpected = twin.load_state_dict(
        {k: v.detach().clone() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if "rotary" not in k and "masked_bias" not in k]
    if missing or unexpected:
        raise KeyError(f"GPT-NeoX twin: missing {missing}, unexpected {unexpected}")
    return twin.to(device=model.device, dtype=next(model.parameters()).dtype).eval()


class _FirstToken:
    """A generate streamer that notes when the first new token arrives (put #2: #1 is the
    prompt)."""

    def __init__(self):
        self.calls, self.first_s = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_s = time.perf_counter()

    def end(self) -> None:
        pass


def run_hf_generate(model, requests: list[Request], sampling: Sampling) -> PolicyRun:
    """Serve the trace one request at a time in arrival order with model.generate."""
    result = PolicyRun("hf_generate")
    t0, cpu0 = time.perf_counter(), time.process_time()
    eos = sampling.eos_token_id
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.rid)):
        wait = t0 + r.arrival_s - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        admit = time.perf_counter()
        stream = _FirstToken()
        kwargs = {"do_sample": False}
        if sampling.mode != "greedy":
            torch.manual_seed(r.seed)  # generate samples from the global generator
            kwargs = {"do_sample": True, "temperature": sampling.temperature,
                      "top_k": sampling.top_k or None}
        ids = torch.tensor([r.prompt], device=model.device)
        with torch.inference_mode():  # explicit mask: else a prompt token equal to the pad id
            out = model.generate(  # would be masked out
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new_tokens,
                min_new_tokens=r.max_new_tokens if eos is None else None,
                eos_token_id=eos, pad_token_id=0, streamer=stream, **kwargs)
        finish = time.perf_counter()
        tokens = out[0, len(r.prompt):].tolist()
        result.records.append({
            "rid": r.rid, "arrival_s": r.arrival_s, "admit_s": admit - t0,
            "first_token_s": (stream.first_s or finish) - t0, "finish_s": finish - t0,
            "prompt_len": len(r.prompt), "max_new_tokens": r.max_new_tokens, "tokens": tokens,
        })
        result.steps += len(tokens)
        result.rows += len(tokens)
    result.total_s = max(rec["finish_s"] for rec in result.records)
    result.cpu_s = time.process_time() - cpu0
    result.records.sort(key=lambda rec: rec["rid"])
    return result
