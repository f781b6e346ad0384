"""The training model's layers run with a per-slot KV cache: one prompt phase per request,
one fused decode step over a range of slots.

The modules are the training ones (built from pipe.layer_specs with the same per-layer
seeds, so a seeded model equals the untrained training model at any TP degree); only the
attention core differs: it reads and writes the preallocated cache instead of attending
over a whole sequence. Logits are vocab-parallel; they are gathered so every TP rank picks
the same token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from megatron.core import parallel_state

from neoxlab.config import ModelConfig
from neoxlab.model.layers import TransformerLayer, head_dim, rotary_dim
from neoxlab.model.pipe import layer_specs
from neoxlab.model.rotary import rotary_tables
from neoxlab.serve.cache import KVCache

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ServeModel(torch.nn.Module):
    """Children named by global pipeline index ("0" embedding ... "L+2" head), as in training,
    so hf_convert.load_into_pipeline and training state dicts apply unchanged."""

    def __init__(self, model: ModelConfig, tp: int, seed: int, max_seq_len: int):
        super().__init__()
        for index, spec in enumerate(layer_specs(model, tp)):
            torch.manual_seed(seed + index)  # as PipelineModule(seed_layers=True) does
            self.add_module(str(index), spec.build())
        self.config = model
        self.tp = tp
        self.source = "random"  # where the weights came from (set by serve.weights)
        self.num_layers = model.num_layers
        cos, sin = rotary_tables(max_seq_len, rotary_dim(model), model.rotary_emb_base,
                                 torch.float32, torch.device("cpu"))
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def blocks(self) -> list[TransformerLayer]:
        return [getattr(self, str(i)) for i in range(1, self.num_layers + 1)]

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        heads = self.config.num_attention_heads // self.tp
        p = next(self.parameters())
        return KVCache(self.num_layers, slots, heads, max_seq_len, head_dim(self.config),
                       p.dtype, p.device)

    def _forward(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 attend: Attend) -> torch.Tensor:
        x = getattr(self, "0")(tokens)
        for i, layer in enumerate(self.blocks()):
            attn_in = layer.input_layernorm(x)
            q, k, v = layer.attention.project_qkv(attn_in, cos.to(x.dtype), sin.to(x.dtype))
            attn = layer.attention.project_out(attend(i, q, k, v))
            if layer.parallel_residual:
                x = x + attn + layer.mlp(layer.post_attention_layernorm(x))
            else:
                x = x + attn
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = getattr(self, str(self.num_layers + 1))(x)
        return self._logits(x)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [..., vocab_size] on every TP rank (padding cut off)."""
        local = getattr(self, str(self.num_layers + 2))(hidden)
        if self.tp > 1:
            local = gather_last_dim(local.contiguous())
        return local[..., : self.config.vocab_size].float()

    @torch.no_grad()
    def prefill(self, prompt: list[int], slot: int, cache: KVCache) -> torch.Tensor:
        """Prompt phase of one request: fill slot's cache, return the last position's logits."""
        p = len(prompt)
        tokens = torch.tensor([prompt], dtype=torch.long, device=cache.k.device)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.k[i, slot, :, :p] = k[0]
            cache.v[i, slot, :, :p] = v[0]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        logits = self._forward(tokens, self.rotary_cos[:p], self.rotary_sin[:p], attend)
        return logits[0, -1]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, lo: int,
               cache: KVCache) -> torch.Tensor:
        """One fused step over slots [lo, lo+n): row r feeds tokens[r] at positions[r].

        Each row writes its new K/V at its own position and attends to positions <= it,
        so requests of different lengths share one batched step. Returns logits [n, vocab].
        """
        n = tokens.shape[0]
        rows = torch.arange(n, device=tokens.device)
        span = int(positions.max()) + 1
        mask = (torch.arange(span, device=tokens.device)[None, :] <= positions[:, None])
        mask = mask[:, None, None, :]
        cos = self.rotary_cos[positions][:, None, None, :]
        sin = self.rotary_sin[positions][:, None, None, :]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = cache.k[i, lo:lo + n], cache.v[i, lo:lo + n]
            keys[rows, :, positions] = k[:, :, 0]
            values[rows, :, positions] = v[:, :, 0]
            return F.scaled_dot_product_attention(
                q, keys[:, :, :span], values[:, :, :span], attn_mask=mask
            )

        logits = self._forward(tokens[:, None], cos, sin, attend)
        return logits[:, 0]


def gather_last_dim(local: torch.Tensor) -> torch.Tensor:
    """All-gather vocab shards over the TP group (megatron's helper allocates on CUDA)."""
    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(local) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)
