"""Where the serve model's weights come from: seeded init, a transformers GPT-NeoX dir, or a
training run's checkpoint.

`random` builds the layers with the training seeds (train.seed), so it is the model a
training run starts from. `hf:<dir>` loads a GPTNeoXForCausalLM checkpoint (local dir,
nothing downloaded) and shards it over TP with the training loader (hf_convert).
`run:<run dir>` loads the newest usable checkpoint of a builtin training run, resharded
from the training TP to the serve TP (run_weights).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from neoxlab.config import ConfigError, ModelConfig
from neoxlab.engines.builtin.model.hf_convert import load_into_pipeline
from neoxlab.layout import padded_vocab_size
from neoxlab.serve.model import ServeModel
from neoxlab.serve.run_weights import find_checkpoint, load_run_weights, run_dir_of


def hf_dir(weights: str) -> Path | None:
    return Path(weights.removeprefix("hf:")) if weights.startswith("hf:") else None


def model_config_from_hf(path: Path, base: ModelConfig) -> ModelConfig:
    """Our ModelConfig for a GPT-NeoX checkpoint dir (its config.json decides the shape)."""
    # deferred: transformers is slow to import, only hf: weights need it
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(path)
    if hf.model_type != "gpt_neox":
        raise ConfigError(
            f"serve.weights=hf:{path} holds a '{hf.model_type}' model; serve loads GPT-NeoX "
            "checkpoints (GPTNeoXForCausalLM); point it at one"
        )
    rope = getattr(hf, "rope_parameters", None) or {}
    rotary_pct = rope.get("partial_rotary_factor", getattr(hf, "rotary_pct", base.rotary_pct))
    base_freq = rope.get("rope_theta", getattr(hf, "rotary_emb_base", base.rotary_emb_base))
    if hf.intermediate_size % hf.hidden_size or hf.hidden_act != "gelu":
        raise ConfigError(
            f"checkpoint MLP (intermediate {hf.intermediate_size}, act {hf.hidden_act}) is not "
            "a multiple of hidden with GELU as in our model; use a standard GPT-NeoX checkpoint"
        )
    return replace(
        base, num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size,
        num_attention_heads=hf.num_attention_heads, vocab_size=hf.vocab_size,
        max_position_embeddings=hf.max_position_embeddings,
        seq_length=min(base.seq_length, hf.max_position_embeddings),
        rotary_pct=float(rotary_pct), rotary_emb_base=int(base_freq),
        parallel_residual=bool(hf.use_parallel_residual),
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        ffn_mult=hf.intermediate_size // hf.hidden_size, layernorm_eps=hf.layer_norm_eps,
    )


def build_serve_model(
    model: ModelConfig, weights: str, seed: int, tp: int, tp_rank: int, max_seq_len: int,
    device: torch.device | None = None,
) -> ServeModel:
    """The serve model for this TP rank, in eval mode, on `device` (the host when None; built
    and loaded on the host, then placed); `source` says where its weights came from (for a
    run: which checkpoint)."""
    path, run_dir = hf_dir(weights), run_dir_of(weights)
    if path is not None:
        model = model_config_from_hf(path, model)
    elif run_dir is None and weights != "random":
        raise ConfigError(
            f"serve.weights='{weights}' is not 'random', 'hf:<GPT-NeoX dir>' or "
            "'run:<training run dir>'; use one of those")
    checkpoint = find_checkpoint(run_dir, model) if run_dir is not None else None
    with torch.device("cpu"):  # whatever torch's default device is
        serve = ServeModel(model, tp, seed, max_seq_len)
        serve.source = weights if weights != "random" else f"random (seed {seed})"
        if path is not None:
            # deferred: transformers is slow to import, only hf: weights need it
            from transformers import GPTNeoXForCausalLM

            hf = GPTNeoXForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
            load_into_pipeline(serve, hf, model, tp_rank, tp, padded_vocab_size(model, tp))
        elif checkpoint is not None:
            load_run_weights(serve, checkpoint, tp, tp_rank)
            serve.source = checkpoint.describe()
    return serve.place(device or torch.device("cpu")).eval()
