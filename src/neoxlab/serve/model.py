"""The training model's layers run with a per-slot KV cache: a batched prompt phase for the
requests admitted together, one fused decode step over a range of slots.

The modules are the training ones (built from pipe.layer_specs with the same per-layer
seeds, so a seeded model equals the untrained training model at any TP degree); only the
attention core differs: it reads and writes the preallocated cache instead of attending
over a whole sequence. Logits are vocab-parallel; they are gathered so every TP rank picks
the same token.

At TP=1 the forward runs by default on the lean path: plain torch ops (F.linear,
F.layer_norm) on the very same parameter tensors, on the CPU with prepacked weights
(serve.packed_linear, neoxlab.serve.packed_linear), rotary applied to Q and K in one op,
rotary tables and the causal bias built once and sliced. megatron-core's parallel layers
cost a Python autograd function and extra ops per call, which at decode sizes is a large
share of a step (bench/serve_profile.py shows the split). TP>1 keeps megatron's layers.
A decode step's attention runs on a C++ kernel on the CPU (serve.native_attention, any TP).

The model is built on the host (the seeded init draws from the CPU generator, as training's
does) and then placed on the rank's device (`place`): weights, rotary tables, causal bias
and the KV cache (new_cache) live there, and every per-step tensor is made beside them. The
two CPU fast paths (prepacked products, the native kernel) are off on any other device.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from megatron.core import parallel_state

from neoxlab.config import ModelConfig
from neoxlab.engines.builtin.model.layers import TransformerLayer, head_dim, rotary_dim
from neoxlab.engines.builtin.model.pipe import layer_specs
from neoxlab.engines.builtin.model.rotary import rotary_tables
from neoxlab.serve import native_attention, packed_linear
from neoxlab.serve.cache import KVCache

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Linear = Callable[..., torch.Tensor]  # F.linear's signature


class ServeModel(torch.nn.Module):
    """Children named by global pipeline index ("0" embedding ... "L+2" head), as in training,
    so hf_convert.load_into_pipeline and training state dicts apply unchanged."""

    linear: Linear  # the lean path's products (use_packed_linear)

    def __init__(self, model: ModelConfig, tp: int, seed: int, max_seq_len: int):
        super().__init__()
        host = torch.device("cpu")  # built here, then placed on the rank's device (place)
        for index, spec in enumerate(layer_specs(model, tp)):
            torch.manual_seed(seed + index)  # as PipelineModule(seed_layers=True) does
            with host:  # the layers allocate their weights on the default device
                self.add_module(str(index), spec.build())
        self.config = model
        self.tp = tp
        self.source = "random"  # where the weights came from (set by serve.weights)
        self.num_layers = model.num_layers
        self.lean = tp == 1  # plain-op forward (serve.lean_decode); TP>1 needs megatron's
        self.native_attend = False  # serve.native_attention (use_native_attention)
        cos, sin = rotary_tables(max_seq_len, rotary_dim(model), model.rotary_emb_base,
                                 torch.float32, host)
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)
        # additive causal bias: row p allows keys 0..p; a decode step slices rows by position
        causal = torch.full((max_seq_len, max_seq_len), float("-inf"), device=host).triu(1)
        self.register_buffer("causal_bias", causal, persistent=False)
        self.use_packed_linear(True)

    @property
    def device(self) -> torch.device:
        """Where the weights, tables and (new_cache) the KV cache live."""
        return self.rotary_cos.device

    def place(self, device: torch.device) -> ServeModel:
        """Move weights and tables to the rank's device; off the CPU, the CPU-only fast
        paths (packed products, the native kernel) are turned off."""
        self.to(device)
        self.use_packed_linear(self.packed_on, self.packed_timed)
        if device.type != "cpu":
            self.native_attend = False
        return self

    def use_packed_linear(self, on: bool, timed: bool = True) -> None:
        """serve.packed_linear: the lean path's products with prepacked weights (oneDNN,
        where this torch has it; on the CPU only, from packed_linear.min_rows() rows).
        serve.packed_linear_timed: only at the decode batch sizes where they make the step
        faster, from packed_linear.TIMED_FROM rows. Whether they do depends on the shapes
        and the machine: the sweep's hidden-256 model decoded at 1424-1484 tok/s packed and
        1677-1732 with F.linear here, where at hidden 512 a block's products ran 1.98x
        faster packed. Products timed alone (their weight stays in cache) and whole steps
        can disagree either way, so whole decode steps are timed."""
        self.packed_on = on  # asked for; used on the CPU only (place)
        fast = on and self.device.type == "cpu" and packed_linear.available()
        self.packed = packed_linear.PackedLinear() if fast else None
        self.linear = self.packed or F.linear
        # a timed bucket's packed products, few rows included (one object: `is` compares)
        self.packed_any: Linear | None = self.packed.any_rows if self.packed else None
        self.packed_timed = timed
        self.packing_pays: dict[int, bool] = {}  # decode row bucket -> packed step faster

    def _decode_fastest(self, rows: int, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """One decode step with whichever products ran this row bucket's first step faster
        (a step rewrites the same cache entries, so it can run more than once), from
        packed_linear.TIMED_FROM rows: whole steps can favour packing below min_rows().
        Only on the lean path at TP=1: megatron's layers do not use them, and TP ranks
        timing apart could choose apart and run different numbers of steps."""
        lean = self.lean and self.tp == 1
        if (self.packed_any is None or not self.packed_timed or not lean
                or rows < packed_linear.TIMED_FROM):
            return step()
        bucket = packed_linear.row_bucket(rows)
        if bucket not in self.packing_pays:
            self.linear = self.packed_any
            step()  # packs the weights and builds oneDNN's kernel for this shape: not timed
            took = {}
            for packed, linear in ((True, self.packed_any), (False, F.linear)):
                self.linear = linear
                start = time.perf_counter()
                out = step()
                took[packed] = time.perf_counter() - start
            self.packing_pays[bucket] = took[True] < took[False]
            if not self.packing_pays[bucket]:
                return out
        self.linear = self.packed_any if self.packing_pays[bucket] else F.linear
        return step()

    def use_native_attention(self, on: bool) -> str:
        """serve.native_attention: decode steps attend through the C++ kernel
        (neoxlab.serve.native_attention) on fp32 host tensors, built here before any timing.
        Returns what decode attention runs on: "native", or "sdpa" and why. Off the CPU
        the kernel is not built: it runs host tensors only."""
        self.native_attend = False
        if not on:
            return "sdpa"
        if self.device.type != "cpu":
            return f"sdpa (the native kernel runs on the CPU; the model is on {self.device})"
        self.native_attend = native_attention.build()
        if self.native_attend:
            return "native"
        return f"sdpa (native kernel not built: {native_attention.unavailable()})"

    def blocks(self) -> list[TransformerLayer]:
        return [getattr(self, str(i)) for i in range(1, self.num_layers + 1)]

    def new_cache(self, slots: int, max_seq_len: int) -> KVCache:
        heads = self.config.num_attention_heads // self.tp
        p = next(self.parameters())
        return KVCache(self.num_layers, slots, heads, max_seq_len, head_dim(self.config),
                       p.dtype, p.device)

    def _forward(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 attend: Attend, pick: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [b, s]; cos/sin [b or 1, s, rotary]; `pick`: flat indices into the b*s
        positions whose logits are wanted (the head runs on those only). Logits
        [len(pick), vocab], or [b, s, vocab] without pick."""
        lean = self.lean and self.tp == 1
        cos, sin = cos.to(self.rotary_dtype()), sin.to(self.rotary_dtype())
        if lean:
            x = F.embedding(tokens, getattr(self, "0").word_embeddings.weight)
        else:
            x = getattr(self, "0")(tokens)
        block = self._lean_block if lean else self._megatron_block
        for i, layer in enumerate(self.blocks()):
            x = block(i, layer, x, cos, sin, attend)
        if pick is not None:
            x = x.reshape(-1, x.shape[-1])[pick]
        if lean:
            return self._lean_head(x)
        norm = getattr(self, str(self.num_layers + 1)).norm
        return self._logits(F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias,
                                         norm.eps))

    def _lean_head(self, x: torch.Tensor) -> torch.Tensor:
        """lean_head on this model's final norm and head weight."""
        return lean_head(self.linear, getattr(self, str(self.num_layers + 1)).norm,
                         getattr(self, str(self.num_layers + 2)).final_linear.weight, x,
                         self.config.vocab_size)

    def rotary_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @staticmethod
    def _megatron_block(i: int, layer: TransformerLayer, x: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """One block through megatron's parallel layers (any TP degree)."""
        attn_in = layer.input_layernorm(x)
        q, k, v = layer.attention.project_qkv(attn_in, cos[:, None], sin[:, None])
        attn = layer.attention.project_out(attend(i, q, k, v))
        if layer.parallel_residual:
            return x + attn + layer.mlp(layer.post_attention_layernorm(x))
        x = x + attn
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _lean_block(self, i: int, layer: TransformerLayer, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The same block in plain ops on the same weights (TP=1)."""
        q, k, v = lean_qkv(self.linear, layer, x, cos, sin)
        return lean_out(self.linear, layer, x, attend(i, q, k, v))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """megatron's head: full-vocabulary logits [..., vocab_size] on every TP rank."""
        local = getattr(self, str(self.num_layers + 2))(hidden)
        if self.tp > 1:
            local = gather_last_dim(local.contiguous())
        return local[..., : self.config.vocab_size].float()

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], slots: list[int], cache: KVCache
                ) -> torch.Tensor:
        """Prompt phase of requests admitted together, in one forward: prompt r fills slot
        slots[r]'s cache. Returns each prompt's last-position logits [n, vocab].

        Prompts are right-padded to the longest; causal attention keeps a real token from
        seeing the padding after it, and the padding's cache entries lie beyond the prompt,
        where every decode step writes its own position before attending to it.
        """
        lengths = [len(p) for p in prompts]
        p = max(lengths)
        device = cache.k.device
        tokens = torch.tensor([q + [0] * (p - len(q)) for q in prompts], dtype=torch.long,
                              device=device)
        index = torch.tensor(slots, dtype=torch.long, device=device)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.k[i, index, :, :p] = k
            cache.v[i, index, :, :p] = v
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        pick = torch.tensor([r * p + n - 1 for r, n in enumerate(lengths)], device=device)
        return self._forward(tokens, self.rotary_cos[None, :p], self.rotary_sin[None, :p],
                             attend, pick)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, lo: int,
               cache: KVCache, span: int | None = None) -> torch.Tensor:
        """One fused step over slots [lo, lo+n): row r feeds tokens[r] at positions[r].

        Each row writes its new K/V at its own position and attends to positions <= it,
        so requests of different lengths share one batched step. `span` (the longest live
        position + 1, known to the caller) saves a host sync. Returns logits [n, vocab].
        """
        if span is None:
            span = int(positions.max()) + 1
        fused = self._decode_attention(positions, lo, span, cache)
        cos, sin = self.rotary_cos[positions][:, None], self.rotary_sin[positions][:, None]
        logits = self._decode_fastest(
            len(tokens), lambda: self._forward(tokens[:, None], cos, sin, fused))
        return logits[:, 0]

    def _decode_attention(self, positions: torch.Tensor, lo: int, span: int,
                          cache: KVCache) -> Attend:
        """Attention of one fused decode step over slots [lo, lo+n), for q/k/v [n, heads, 1,
        d]: each row writes its K/V at its position and attends to positions <= it, reading
        the slot range only up to `span` (the longest live position + 1); the native kernel
        (use_native_attention) reads each row only up to its own position."""
        n = positions.shape[0]
        rows = torch.arange(n, device=positions.device)
        native = self.native_attend and native_attention.applies(cache.k)
        bias = None if native else \
            self.causal_bias[positions, :span][:, None, None, :].to(self.rotary_dtype())

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = cache.k[i, lo:lo + n], cache.v[i, lo:lo + n]
            keys[rows, :, positions] = k[:, :, 0]
            values[rows, :, positions] = v[:, :, 0]
            if native:
                return native_attention.decode_attention(q, keys, values, positions)
            return F.scaled_dot_product_attention(
                q, keys[:, :, :span], values[:, :, :span], attn_mask=bias
            )

        return attend


def lean_qkv(linear: Linear, layer: TransformerLayer, x: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A lean block up to attention: input norm, fused QKV projection, one rotary op for Q
    and K together; q, k, v [b, heads, s, head_dim] are views of the QKV output."""
    att, ln1 = layer.attention, layer.input_layernorm
    b, s, _ = x.shape
    attn_in = F.layer_norm(x, ln1.normalized_shape, ln1.weight, ln1.bias, ln1.eps)
    qkv = linear(attn_in, att.query_key_value.weight, att.query_key_value.bias)
    qkv = qkv.view(b, s, att.heads_local, 3, att.head_dim)  # GPT-NeoX: per head q|k|v
    rot = cos.shape[-1]
    if rot:
        qk = qkv[:, :, :, :2, :rot]
        half = rot // 2
        rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
        qkv[:, :, :, :2, :rot] = qk * cos[:, :, None, None] + rotated * sin[:, :, None, None]
    return qkv.transpose(1, 2).unbind(3)


def lean_out(linear: Linear, layer: TransformerLayer, x: torch.Tensor, context: torch.Tensor
             ) -> torch.Tensor:
    """A lean block from attention's context [b, heads, s, head_dim] on: output projection,
    FFN and residuals (parallel or sequential, as the layer says)."""
    att, mlp, ln2 = layer.attention, layer.mlp, layer.post_attention_layernorm
    attn = linear(context.transpose(1, 2).reshape(x.shape), att.dense.weight, att.dense.bias)

    def ffn(y: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(y, ln2.normalized_shape, ln2.weight, ln2.bias, ln2.eps)
        y = F.gelu(linear(y, mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias))
        return linear(y, mlp.dense_4h_to_h.weight, mlp.dense_4h_to_h.bias)

    if layer.parallel_residual:
        return x + attn + ffn(x)
    x = x + attn
    return x + ffn(x)


def lean_head(linear: Linear, norm: torch.nn.LayerNorm, weight: torch.Tensor, x: torch.Tensor,
              vocab_size: int) -> torch.Tensor:
    """Final norm and head (TP=1): logits [..., vocab_size] in fp32, padding cut off."""
    x = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return linear(x, weight)[..., :vocab_size].float()


def gather_last_dim(local: torch.Tensor) -> torch.Tensor:
    """All-gather vocab shards over the TP group (megatron's helper allocates on CUDA)."""
    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(local) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)
