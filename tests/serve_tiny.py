"""The tiny serve model the serve unit tests share: weights spread out so that greedy argmax
never rests on a near-tie (token equality would otherwise be luck)."""

from __future__ import annotations

import torch

from neoxlab.config import ModelConfig
from neoxlab.serve.model import ServeModel
from neoxlab.serve.policies import policy_for
from neoxlab.serve.scheduler import Sampling, ServeLoop
from neoxlab.serve.weights import build_serve_model

MAX_SEQ = 48
TINY = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
                   max_position_embeddings=64, vocab_size=200, rotary_pct=0.5)


def tiny_model() -> ServeModel:
    """TINY at TP=1, seed 3, its matrices scaled by 5 (call after init_single_process)."""
    m = build_serve_model(TINY, "random", 3, 1, 0, MAX_SEQ)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    return m


def greedy_tokens(model: ServeModel, policy: str, requests, slots: int) -> list[list[int]]:
    """Each request's greedy tokens under one policy with `slots` slots."""
    loop = ServeLoop(model, policy_for(policy, slots, 0.005), slots, MAX_SEQ, Sampling())
    return [r["tokens"] for r in loop.run(requests).records]


def kernel_calls(monkeypatch) -> list[int]:
    """Wraps the native decode-attention kernel's entry point for the rest of the test: each
    call appends its row count, so a test can tell the kernel really ran, and on how many rows."""
    from neoxlab.serve import native_attention

    calls: list[int] = []
    kernel = native_attention.decode_attention

    def counted(q, k, v, positions):
        calls.append(q.shape[0])
        return kernel(q, k, v, positions)

    monkeypatch.setattr(native_attention, "decode_attention", counted)
    return calls
