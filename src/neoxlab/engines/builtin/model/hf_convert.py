"""Load a transformers GPTNeoXForCausalLM state dict into this rank's pipeline layers.

Used to check numerical equivalence with transformers and to serve HF GPT-NeoX checkpoints.
Column-parallel weights are split by output rows, row-parallel ones by input columns; the
per-head QKV layout is the same in both, so a contiguous row split keeps whole heads.
"""

from __future__ import annotations

import torch

from neoxlab.config import ModelConfig

COLUMN_PARALLEL = ("attention.query_key_value", "mlp.dense_h_to_4h")
ROW_PARALLEL = ("attention.dense", "mlp.dense_4h_to_h")


def _rows(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    return t.chunk(tp, dim=0)[rank]


def _cols(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    return t.chunk(tp, dim=1)[rank]


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad the vocabulary dimension to the padded size with zero rows."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def layer_state(
    hf: dict[str, torch.Tensor], layer: int, rank: int, tp: int
) -> dict[str, torch.Tensor]:
    """The TP shard of block `layer` (0-based) in our module's parameter names."""
    prefix = f"gpt_neox.layers.{layer}."
    out = {}
    for name, tensor in hf.items():
        if not name.startswith(prefix) or "rotary" in name or name.endswith("masked_bias"):
            continue
        key = name.removeprefix(prefix)
        module = key.rsplit(".", 1)[0]
        if module in COLUMN_PARALLEL:
            tensor = _rows(tensor, rank, tp)
        elif module in ROW_PARALLEL and key.endswith("weight"):
            tensor = _cols(tensor, rank, tp)
        out[key] = tensor
    return out


def load_into_pipeline(
    pipe_module: torch.nn.Module, hf: dict[str, torch.Tensor], model: ModelConfig,
    rank: int, tp: int, padded_vocab: int,
) -> None:
    """Copy HF weights into the layers this rank holds (children named by global index)."""
    last_block = model.num_layers
    for name, layer in pipe_module.named_children():
        if not name.isdigit():
            continue
        index = int(name)
        if index == 0:
            weight = _padded_rows(hf["gpt_neox.embed_in.weight"], padded_vocab)
            state = {"word_embeddings.weight": _rows(weight, rank, tp)}
        elif index <= last_block:
            state = layer_state(hf, index - 1, rank, tp)
        elif index == last_block + 1:
            state = {"norm.weight": hf["gpt_neox.final_layer_norm.weight"],
                     "norm.bias": hf["gpt_neox.final_layer_norm.bias"]}
        else:
            head = hf["embed_out.weight"] if "embed_out.weight" in hf else hf["lm_head.weight"]
            weight = _padded_rows(head, padded_vocab)  # transformers 5 names it lm_head
            state = {"final_linear.weight": _rows(weight, rank, tp)}
        missing, unexpected = layer.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "rotary" not in m]:
            raise KeyError(f"layer {index}: missing {missing}, unexpected {unexpected}")
