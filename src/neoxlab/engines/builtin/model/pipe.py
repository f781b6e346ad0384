"""The GPT-NeoX model as a DeepSpeed PipelineModule of megatron-core TP layers.

Stages exchange only the hidden state [b, s, h]; token ids enter the first stage and labels
the loss on the last, so nothing but activations crosses a stage boundary.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.utils.checkpoint
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from megatron.core import tensor_parallel

from neoxlab.config import ModelConfig
from neoxlab.engines.builtin.model.layers import (
    TransformerLayer,
    megatron_config,
    normal_init,
    rotary_dim,
)
from neoxlab.engines.builtin.model.rotary import rotary_tables
from neoxlab.layout import padded_vocab_size


class EmbeddingPipe(torch.nn.Module):
    """Token ids [b, s] -> hidden [b, s, h] (vocab split over TP)."""

    def __init__(self, model: ModelConfig, tp: int):
        super().__init__()
        self.word_embeddings = tensor_parallel.VocabParallelEmbedding(
            padded_vocab_size(model, tp), model.hidden_size,
            init_method=normal_init(model.init_std), config=megatron_config(tp),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(tokens)


class TransformerLayerPipe(TransformerLayer):
    """A transformer block that owns its rotary tables, so it needs only the hidden state."""

    def __init__(self, model: ModelConfig, tp: int):
        super().__init__(model, megatron_config(tp))
        cos, sin = rotary_tables(
            model.seq_length, rotary_dim(model), model.rotary_emb_base, torch.float32,
            torch.device("cpu"),
        )
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        s = x.shape[1]
        cos = self.rotary_cos[:s].to(x.dtype)
        sin = self.rotary_sin[:s].to(x.dtype)
        return super().forward(x, cos, sin)


class FinalNormPipe(torch.nn.Module):
    def __init__(self, model: ModelConfig):
        super().__init__()
        self.norm = torch.nn.LayerNorm(model.hidden_size, eps=model.layernorm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class LMHeadPipe(torch.nn.Module):
    """Hidden -> vocab-parallel logits; untied from the input embedding as in GPT-NeoX-20B."""

    def __init__(self, model: ModelConfig, tp: int):
        super().__init__()
        self.final_linear = tensor_parallel.ColumnParallelLinear(
            model.hidden_size, padded_vocab_size(model, tp), config=megatron_config(tp),
            init_method=normal_init(model.init_std), bias=False, gather_output=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, _ = self.final_linear(x)
        return logits


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over vocab-parallel logits (fp32 for stability)."""
    losses = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)
    return losses.mean()


def layer_specs(model: ModelConfig, tp: int) -> list[LayerSpec]:
    specs = [LayerSpec(EmbeddingPipe, model, tp)]
    specs += [LayerSpec(TransformerLayerPipe, model, tp) for _ in range(model.num_layers)]
    specs += [LayerSpec(FinalNormPipe, model), LayerSpec(LMHeadPipe, model, tp)]
    return specs


def _seed_layer(seed) -> None:
    torch.manual_seed(int(seed))  # DeepSpeed passes numpy ints from its partitioner


def build_pipeline_model(
    model: ModelConfig,
    topology: PipeModelDataParallelTopology,
    seed: int,
    activation_checkpointing: bool,
    partition_method: str,
) -> PipelineModule:
    """Seeds each layer by its global index, so weights match across any TP/PP/DP layout."""
    tp = topology.get_dim("model")
    return PipelineModule(
        layers=layer_specs(model, tp),
        topology=topology,
        loss_fn=lm_loss,
        seed_layers=True,
        seed_fn=_seed_layer,
        base_seed=seed,
        partition_method=partition_method,
        activation_checkpoint_interval=1 if activation_checkpointing else 0,
        activation_checkpoint_func=partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
        checkpointable_layers=["TransformerLayerPipe"],
    )
