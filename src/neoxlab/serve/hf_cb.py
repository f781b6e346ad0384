"""`hf_cb`: transformers' continuous batching (ContinuousBatchingManager) on the same trace.

transformers 5.24 cannot run GPT-NeoX in continuous batching (its attention calls the paged
cache's update() without the `kwargs` argument, and the generation thread dies), so unless
the probe below says GPT-NeoX works, hf_cb runs a LlamaForCausalLM twin: same hidden size,
layers, heads, vocabulary and (within 0.1 %) parameters and FLOPs per token. The label says
which model ran, and is printed beside the numbers. On CPU, the cache (num_blocks x
page_size tokens) and max_batch_tokens are set explicitly: the automatic sizing assumes a GPU.
hf_cb_tune.py searches them (and the CPU attention implementation) before the timed runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cache

import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.scheduler import PolicyRun, Sampling
from neoxlab.serve.workload import Request


@dataclass(frozen=True)
class CBSizing:
    num_blocks: int = 64
    max_batch_tokens: int = 512
    page_size: int = 32
    attn: str = "sdpa"  # CPU attention implementation: sdpa | eager (CB runs it paged)


def _generation_config(max_new_tokens: int, sampling: Sampling):
    # deferred: transformers is slow to import, only the HF policies need it
    from transformers import GenerationConfig

    eos = -1 if sampling.eos_token_id is None else sampling.eos_token_id
    sample = sampling.mode != "greedy"
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=eos, pad_token_id=0,
        temperature=sampling.temperature if sample else None,
        top_k=sampling.top_k if sample and sampling.top_k else None,
    )


def _cb_config(sizing: CBSizing):
    # deferred: transformers is slow to import, only the HF policies need it
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return ContinuousBatchingConfig(num_blocks=sizing.num_blocks, page_size=sizing.page_size,
                                    max_batch_tokens=sizing.max_batch_tokens)


@cache
def neox_cb_supported() -> bool:
    """Does the installed transformers run GPT-NeoX in continuous batching, correctly?

    A tiny random GPT-NeoX generates greedily through generate_batch and through generate;
    supported means no error and the same tokens.
    """
    # deferred: transformers is slow to import, only the HF policies need it
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=64, hidden_size=32, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32)).eval()
    prompt, steps = [1, 2, 3, 4], 4
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                               pad_token_id=0)[0, len(prompt):].tolist()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    level = cb_logger.level
    cb_logger.setLevel(logging.CRITICAL)  # the expected failure logs a traceback
    try:
        out = model.generate_batch([prompt], generation_config=_generation_config(
            steps, Sampling()), continuous_batching_config=_cb_config(CBSizing(8, 64, 16)),
            warmup=False)
    except Exception:  # noqa: BLE001 - any failure means unsupported
        return False
    finally:
        cb_logger.setLevel(level)
    (result,) = out.values()
    return result.error is None and list(result.generated_tokens) == reference


def llama_twin(model: ModelConfig, seed: int):
    """A Llama with GPT-NeoX's shape: SwiGLU width 2/3 of the GELU MLP keeps params equal."""
    # deferred: transformers is slow to import, only the HF policies need it
    from transformers import LlamaConfig, LlamaForCausalLM

    ffn = model.ffn_mult * model.hidden_size
    cfg = LlamaConfig(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size,
        intermediate_size=round(2 * ffn / 3), num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_attention_heads,
        max_position_embeddings=model.max_position_embeddings, rms_norm_eps=model.layernorm_eps,
        tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).float().eval()


def hf_cb_model(model: ModelConfig, weights: str, seed: int):
    """(model, label): the same GPT-NeoX checkpoint when CB supports it, else the Llama twin."""
    # deferred: transformers is slow to import, only the HF policies need it
    import transformers

    if neox_cb_supported() and weights.startswith("hf:"):
        # deferred: transformers is slow to import, only the HF policies need it
        from transformers import GPTNeoXForCausalLM

        path = weights.removeprefix("hf:")
        return GPTNeoXForCausalLM.from_pretrained(path).float().eval(), "gpt-neox (same weights)"
    version = transformers.__version__
    why = "" if neox_cb_supported() else f", GPT-NeoX unsupported in CB by {version}"
    return llama_twin(model, seed), f"llama twin (matched shape{why})"


def run_hf_cb(model, requests: list[Request], sizing: CBSizing, sampling: Sampling) -> PolicyRun:
    """Submit each request at its arrival time; collect tokens and timestamps as they finish."""
    longest = max(r.max_new_tokens for r in requests)
    if model.config._attn_implementation not in (sizing.attn, f"paged|{sizing.attn}"):
        model.set_attn_implementation(sizing.attn)
    manager = model.init_continuous_batching(
        generation_config=_generation_config(longest, sampling),
        continuous_batching_config=_cb_config(sizing),
    )
    manager.start()
    result = PolicyRun("hf_cb")
    outputs: dict[str, object] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()

    def drain(until: float) -> None:
        while True:
            left = until - time.perf_counter()
            out = manager.get_result(timeout=max(0.0005, min(left, 0.01)))
            if out is not None and out.is_finished():
                outputs[out.request_id] = out
            if time.perf_counter() >= until or (out is None and not manager.is_running()):
                return

    try:
        for r in sorted(requests, key=lambda r: r.arrival_s):
            drain(t0 + r.arrival_s)
            manager.add_request(r.prompt, request_id=str(r.rid), max_new_tokens=r.max_new_tokens,
                                record_timestamps=True)
        deadline = time.perf_counter() + 600
        while len(outputs) < len(requests) and time.perf_counter() < deadline:
            if not manager.is_running():
                break
            drain(time.perf_counter() + 0.05)
        result.cpu_s = time.process_time() - cpu0
    finally:
        manager.stop(block=True, timeout=30)
    for r in requests:
        out = outputs.get(str(r.rid))
        if out is None or out.error is not None:
            error = getattr(out, "error", "no result")
            raise RuntimeError(f"hf_cb request {r.rid} failed: {error}")
        stamps = out.timestamps or [out.lifespan[1]]
        result.records.append({
            "rid": r.rid, "arrival_s": r.arrival_s, "admit_s": out.lifespan[0] - t0,
            "first_token_s": stamps[0] - t0, "finish_s": out.lifespan[1] - t0,
            "prompt_len": len(r.prompt), "max_new_tokens": r.max_new_tokens,
            "tokens": list(out.generated_tokens),
        })
    result.total_s = max(rec["finish_s"] for rec in result.records)
    return result
