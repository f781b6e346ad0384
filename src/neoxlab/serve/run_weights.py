"""Serve weights from a training run (`serve.weights=run:<run dir>`): its newest usable checkpoint.

The builtin engine's checkpoint holds DeepSpeed's per-layer files of the PipelineModule,
`layer_<index>-model_<tp rank>-model_states.pt`, one per global layer index and training TP
rank. A layer's full tensors are its TP shards concatenated along megatron's partition
dimension (column-parallel weights and biases, and the vocab-parallel embedding and head,
by output rows; row-parallel weights by input columns); replicated tensors (LayerNorms,
row-parallel biases) come from shard 0. The full tensors are then split for the serve TP,
so a run trained at one TP serves at any other. The vocabulary is cut to vocab_size and
padded again for the serve TP (padding rows are never looked up, and serve drops their
logits), because the padded size depends on the TP degree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from neoxlab.config import Config, ConfigError, ModelConfig
from neoxlab.engines.builtin import checkpoints
from neoxlab.engines.registry import without_checkpoints
from neoxlab.layout import padded_vocab_size
from neoxlab.run import rundir

PREFIX = "run:"
# What must agree between the run and serve's cfg.model for the weights to fit and mean
# the same thing; name, lengths, vocab padding multiple and init_std do not matter.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_mult",
                "rotary_pct", "rotary_emb_base", "parallel_residual", "tie_embeddings",
                "layernorm_eps")


def run_dir_of(weights: str) -> Path | None:
    return Path(weights.removeprefix(PREFIX)) if weights.startswith(PREFIX) else None


@dataclass(frozen=True)
class RunCheckpoint:
    """The checkpoint serve loads: where, after which step, and how training sharded it."""

    run_dir: Path
    path: Path
    step: int
    model: ModelConfig  # the run's model
    train_tp: int

    def describe(self) -> str:
        return f"run:{self.run_dir} step {self.step} (trained at tp={self.train_tp})"


def _run_config(run_dir: Path) -> Config:
    if not (run_dir / "config.json").is_file():
        raise ConfigError(
            f"serve.weights=run:{run_dir}: not a run dir (no config.json); give a training "
            "run's directory, results/<experiment>/<run_id>")
    try:
        return rundir.load_config(run_dir)
    except (ValueError, TypeError, ConfigError) as exc:
        raise ConfigError(f"serve.weights=run:{run_dir}: its config.json is unreadable "
                          f"({exc}); point at an intact training run") from exc


def shape_mismatch(run: ModelConfig, serve: ModelConfig) -> list[str]:
    """'field: run X, serve Y' for every shape field that differs."""
    return [f"{f}: run {getattr(run, f)!r}, serve {getattr(serve, f)!r}"
            for f in SHAPE_FIELDS if getattr(run, f) != getattr(serve, f)]


def find_checkpoint(run_dir: Path, serve_model: ModelConfig,
                    trains: Callable[[str], bool] | None = None) -> RunCheckpoint:
    """The newest usable checkpoint of a builtin training run whose model is serve's model;
    ConfigError naming the problem and the fix otherwise. `trains(task name)`: the task
    registry's word on whether a task trains (None: the serve task's rules asked it before
    anything was planned)."""
    cfg = _run_config(run_dir)
    where = f"serve.weights=run:{run_dir}"
    kind = without_checkpoints(cfg, trains is None or trains(cfg.task.name))
    if kind is not None:
        raise ConfigError(f"{where} is {kind}; serve loads the checkpoints of builtin "
                          "training runs (task=train, engine=builtin)")
    differ = shape_mismatch(cfg.model, serve_model)
    if differ:
        raise ConfigError(
            f"{where}: the run's model differs from serve's model ({'; '.join(differ)}); "
            f"serve with the run's model (model={cfg.model.name} and the same model.* "
            "overrides)")
    found = checkpoints.scan(run_dir)
    good = checkpoints.usable(found)
    if not good:
        why = "; ".join(f"step {c.step}: {c.problem}" for c in found) or "none written"
        raise ConfigError(
            f"{where} has no usable checkpoint in {checkpoints.root(run_dir)} ({why}); train "
            "with train.checkpoint_every=<steps> (or let the run finish a checkpoint)")
    newest = good[0]
    return RunCheckpoint(run_dir, newest.path, newest.step, cfg.model, cfg.parallel.tp)


def layer_file(path: Path, index: int, tp_rank: int) -> Path:
    """DeepSpeed's name for one layer's state on one TP rank (PipelineModule.ckpt_layer_path)."""
    return path / f"layer_{index:02d}-model_{tp_rank:02d}-model_states.pt"


def read_shards(ckpt: RunCheckpoint, index: int) -> list[dict[str, torch.Tensor]]:
    """Layer `index`'s state dict on every training TP rank, in rank order."""
    shards = []
    for rank in range(ckpt.train_tp):
        file = layer_file(ckpt.path, index, rank)
        if not file.is_file():
            raise ConfigError(
                f"checkpoint {ckpt.path} lacks {file.name} (layer {index}, TP rank {rank} of "
                f"{ckpt.train_tp}); it is not a builtin-engine checkpoint of this run's model")
        state = torch.load(file, map_location="cpu", weights_only=True)
        shards.append({k: v for k, v in state.items() if isinstance(v, torch.Tensor)})
    return shards


def _vocab_rows(full: torch.Tensor, ckpt: RunCheckpoint, serve_rows: int) -> torch.Tensor:
    """Cut the training padding off a vocab-parallel tensor and pad it for the serve TP."""
    trained = padded_vocab_size(ckpt.model, ckpt.train_tp)
    if full.shape[0] != trained:
        raise ConfigError(
            f"checkpoint {ckpt.path}: vocabulary tensor has {full.shape[0]} rows, but the run's "
            f"config pads vocab_size={ckpt.model.vocab_size} to {trained} at tp={ckpt.train_tp}"
            "; the checkpoint does not belong to this run's config")
    real = full[: ckpt.model.vocab_size]
    return torch.cat([real, real.new_zeros(serve_rows - real.shape[0], *real.shape[1:])])


def serve_state(layer: torch.nn.Module, index: int, ckpt: RunCheckpoint, tp: int,
                tp_rank: int) -> dict[str, torch.Tensor]:
    """The tensors of serve layer `index` on this TP rank, from the training shards."""
    shards = read_shards(ckpt, index)
    vocab_layer = index in (0, ckpt.model.num_layers + 2)
    out = {}
    for name, param in layer.named_parameters():
        parts = [s[name] for s in shards if name in s]
        if len(parts) != len(shards):
            raise ConfigError(f"checkpoint {ckpt.path}: layer {index} has no '{name}' on every "
                              "TP rank; it does not hold this model's layers")
        if not getattr(param, "tensor_model_parallel", False):
            out[name] = parts[0]
            continue
        dim = param.partition_dim
        full = torch.cat(parts, dim=dim)
        if vocab_layer and dim == 0:
            full = _vocab_rows(full, ckpt, param.shape[0] * tp)
        out[name] = full.chunk(tp, dim=dim)[tp_rank]
    return out


def load_run_weights(serve: torch.nn.Module, ckpt: RunCheckpoint, tp: int, tp_rank: int
                     ) -> None:
    """Copy the checkpoint into the serve model's layers (children named by global index)."""
    for name, layer in serve.named_children():
        if not name.isdigit():
            continue
        state = serve_state(layer, int(name), ckpt, tp, tp_rank)
        params = dict(layer.named_parameters())
        for key, tensor in state.items():
            expected = params[key].shape
            if tensor.shape != expected:
                raise ConfigError(
                    f"checkpoint {ckpt.path}: layer {name} '{key}' is {tuple(tensor.shape)} "
                    f"after resharding, serve expects {tuple(expected)}; the run's model "
                    "does not match serve's")
        layer.load_state_dict(state, strict=False)  # buffers (rotary) and extra state stay


def validate_run_weights(weights: str, model: ModelConfig,
                         trains: Callable[[str], bool] | None = None) -> list[str]:
    """The problem with `run:<dir>` weights as a list (empty when loadable)."""
    path = run_dir_of(weights)
    if path is None:
        return []
    try:
        find_checkpoint(path, model, trains)
    except ConfigError as exc:
        return [str(exc)]
    return []

