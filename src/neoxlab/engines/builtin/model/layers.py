"""GPT-NeoX blocks on megatron-core tensor-parallel linear layers.

Attention heads and MLP columns are split over the TP group; LayerNorms are replicated.
Weights are created on CPU at full size and split (use_cpu_initialization), so a layer built
with the same seed holds the same numbers at any TP degree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.model_parallel_config import ModelParallelConfig

from neoxlab.config import ModelConfig
from neoxlab.engines.builtin.model.rotary import apply_rotary


def megatron_config(tp: int, dtype: torch.dtype = torch.float32) -> ModelParallelConfig:
    """TP-only megatron config: DeepSpeed owns the pipeline, so megatron sees pp=1."""
    return ModelParallelConfig(
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        perform_initialization=True,
        params_dtype=dtype,
        sequence_parallel=False,
        gradient_accumulation_fusion=False,
    )


def normal_init(std: float):
    def init(weight: torch.Tensor) -> None:
        torch.nn.init.normal_(weight, mean=0.0, std=std)

    return init


def head_dim(model: ModelConfig) -> int:
    return model.hidden_size // model.num_attention_heads


def rotary_dim(model: ModelConfig) -> int:
    return int(head_dim(model) * model.rotary_pct)


class ParallelAttention(torch.nn.Module):
    """Causal self-attention with heads split over TP; QKV laid out per head as GPT-NeoX."""

    def __init__(self, model: ModelConfig, mp: ModelParallelConfig, num_layers: int):
        super().__init__()
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads_local = model.num_attention_heads // tp
        self.head_dim = head_dim(model)
        out_std = model.init_std / math.sqrt(2.0 * num_layers)
        self.query_key_value = tensor_parallel.ColumnParallelLinear(
            model.hidden_size, 3 * model.hidden_size, config=mp,
            init_method=normal_init(model.init_std), bias=True, gather_output=False,
        )
        self.dense = tensor_parallel.RowParallelLinear(
            model.hidden_size, model.hidden_size, config=mp, init_method=normal_init(out_std),
            bias=True, input_is_parallel=True, skip_bias_add=False,
        )

    def project_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [b, s, h] -> q, k, v [b, heads_local, s, head_dim] with rotary applied."""
        qkv, _ = self.query_key_value(x)
        b, s, _ = qkv.shape
        qkv = qkv.view(b, s, self.heads_local, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def project_out(self, context: torch.Tensor) -> torch.Tensor:
        """context [b, heads_local, s, head_dim] -> [b, s, h] (all-reduced over TP)."""
        b, _, s, _ = context.shape
        out, _ = self.dense(context.transpose(1, 2).reshape(b, s, -1))
        return out

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project_qkv(x, cos, sin)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.project_out(context)


class ParallelMLP(torch.nn.Module):
    """h -> ffn_mult*h (column-parallel) -> GELU -> h (row-parallel)."""

    def __init__(self, model: ModelConfig, mp: ModelParallelConfig, num_layers: int):
        super().__init__()
        ffn = model.ffn_mult * model.hidden_size
        out_std = model.init_std / math.sqrt(2.0 * num_layers)
        self.dense_h_to_4h = tensor_parallel.ColumnParallelLinear(
            model.hidden_size, ffn, config=mp, init_method=normal_init(model.init_std),
            bias=True, gather_output=False,
        )
        self.dense_4h_to_h = tensor_parallel.RowParallelLinear(
            ffn, model.hidden_size, config=mp, init_method=normal_init(out_std), bias=True,
            input_is_parallel=True, skip_bias_add=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.dense_h_to_4h(x)
        out, _ = self.dense_4h_to_h(F.gelu(hidden))
        return out


class TransformerLayer(torch.nn.Module):
    """GPT-NeoX block: parallel residual x + attn(ln1 x) + mlp(ln2 x), or sequential."""

    def __init__(self, model: ModelConfig, mp: ModelParallelConfig):
        super().__init__()
        self.parallel_residual = model.parallel_residual
        self.input_layernorm = torch.nn.LayerNorm(model.hidden_size, eps=model.layernorm_eps)
        self.post_attention_layernorm = torch.nn.LayerNorm(
            model.hidden_size, eps=model.layernorm_eps
        )
        self.attention = ParallelAttention(model, mp, model.num_layers)
        self.mlp = ParallelMLP(model, mp, model.num_layers)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.attention(self.input_layernorm(x), cos, sin)
        if self.parallel_residual:
            return x + attn + self.mlp(self.post_attention_layernorm(x))
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))
