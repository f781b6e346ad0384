"""Stage (a) of the loss guard: what a codec does to a dimension's own messages.

The relative error ||x - x'|| / ||x|| of encoding and decoding, pooled over the tensors the
capture run kept of that dimension (comm/capture.py: the first messages of each dimension,
from every rank, as the engine handed them over). A codec that runs twice on a message
(the compressed all-reduce codes the chunks, then their sum) errs about twice as much; the
budget is set for one coding (tune.error_budget, docs/tune.md). Error feedback does not
change one step's error, only what it adds up to, so it is not a term here.

Where nothing can be captured (tune.measure=false: a cluster this machine cannot run, and
compression=auto's plan), the tensors are seeded stand-ins, and the report says so: Gaussian
for activations and gradients, parameter-like for ZeRO's all-gathers of parameters
(`parameter_like`). A flat parameter buffer at init holds LayerNorm weights (ones), biases
(zeros) and Gaussian matrices; ZFP and int8/int4 code constant blocks exactly, so its error
is the Gaussian part's times the square root of that part's share of the norm, which is
small in small models (neox_tiny at TP=2, ZFP rate 8: 0.0042 on its parameters, 0.018 on
Gaussian noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neoxlab.compress import make_compressor
from neoxlab.config import Config, ModelConfig
from neoxlab.layout import padded_vocab_size

SYNTHETIC_NUMEL = 1 << 15
SYNTHETIC_TENSORS = 4
PROXY_TENSORS = 8  # a dimension's first captured tensors coded (each codec: seconds on a CPU)


def relative_error(spec: str, tensors: list[torch.Tensor]) -> float | None:
    """sqrt(sum ||x - x'||^2 / sum ||x||^2) over the tensors; None without tensors."""
    if not tensors:
        return None
    codec = make_compressor(spec)
    err = norm = 0.0
    for x in tensors[:PROXY_TENSORS]:
        y = codec.decode(codec.encode(x))
        ref = x.double()
        err += float(torch.sum((y.double() - ref) ** 2))
        norm += float(torch.sum(ref ** 2))
    if norm == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return math.sqrt(err / norm)


def synthetic(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Seeded Gaussian stand-ins for a dimension's messages (no capture possible)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(SYNTHETIC_NUMEL, generator=gen) * 1e-3).to(dtype)
            for _ in range(SYNTHETIC_TENSORS)]


@dataclass(frozen=True)
class ParamClass:
    """Values of one kind in a TP rank's share of the model as the builtin engine
    initialises it: a constant (LayerNorm weights 1, biases 0) or Gaussian at `std`."""

    name: str
    count: int
    value: float = 0.0
    std: float = 0.0

    @property
    def square_norm(self) -> float:
        return self.count * (self.value ** 2 + self.std ** 2)


def parameter_classes(model: ModelConfig, tp: int) -> list[ParamClass]:
    """The classes of the parameters one TP rank holds, pooled over pipeline stages (the
    capture pools every rank's messages). engines/builtin/model: LayerNorms (replicated over
    TP) start at weight 1, bias 0; megatron's linear biases at 0 (column-parallel split over
    TP, row-parallel replicated); the embedding, QKV, MLP-in and the untied head (built
    whatever tie_embeddings says) at init_std; attention-out and MLP-out at
    init_std / sqrt(2 layers)."""
    h, layers = model.hidden_size, model.num_layers
    ffn = model.ffn_mult * h
    norms = 2 * layers + 1  # two per block and the final one
    vocab_rows = padded_vocab_size(model, tp) // tp
    return [
        ParamClass("layernorm weights", norms * h, value=1.0),
        ParamClass("biases", norms * h + layers * ((3 * h + ffn) // tp + 2 * h)),
        ParamClass("weights", 2 * vocab_rows * h + layers * (3 * h + ffn) * h // tp,
                   std=model.init_std),
        ParamClass("output weights", layers * (h + ffn) * h // tp,
                   std=model.init_std / math.sqrt(2.0 * layers)),
    ]


def parameter_like(cfg: Config, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Seeded stand-ins for ZeRO's parameter all-gathers: one tensor of SYNTHETIC_NUMEL
    values per parameter class, weighted as the model weighs them. Constants keep their
    value (a cast codes 1.0 exactly, not 0.3); each Gaussian class's std is scaled so that
    its share of the squared norm is the model's. ZFP and int8/int4 scale each block, so a
    Gaussian class's own error does not change with its std: the pooled error is the model's
    at init, in milliseconds whatever its size. Left out: int8/int4 blocks (256 values)
    that hold a LayerNorm's ones and a matrix's first values, where hidden_size < 256 (int8
    up to 1.6x low on neox_tiny); engine=neox's own init (GPT-NeoX's small_init, wang_init)."""
    classes = parameter_classes(cfg.model, cfg.parallel.tp)
    constant = [c for c in classes if c.std == 0.0]
    real = sum(c.square_norm for c in constant)
    standing = SYNTHETIC_NUMEL * sum(c.value ** 2 for c in constant)
    per_real = standing / real  # the stand-ins' squared norm per unit of the model's
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in classes:
        if c.std == 0.0:
            x = torch.full((SYNTHETIC_NUMEL,), c.value)
        else:
            std = math.sqrt(per_real * c.square_norm / SYNTHETIC_NUMEL)
            x = torch.randn(SYNTHETIC_NUMEL, generator=gen) * std
        out.append(x.to(dtype))
    return out


def stand_ins(cfg: Config, dtypes: dict[str, torch.dtype]) -> dict[str, list[torch.Tensor]]:
    """Each dimension's stand-ins (dim -> its messages' dtype): parameter-like for ZeRO's
    all-gathers, seeded Gaussian for the rest; one list per kind and dtype, so dimensions
    that share one are coded once (errors)."""
    made: dict[tuple[bool, torch.dtype], list[torch.Tensor]] = {}
    out = {}
    for dim, dtype in dtypes.items():
        key = (dim == "zero", dtype)
        if key not in made:
            made[key] = parameter_like(cfg, dtype) if key[0] else synthetic(dtype)
        out[dim] = made[key]
    return out


def errors(specs: list[str], by_dim: dict[str, list[torch.Tensor]]
           ) -> dict[tuple[str, str], float | None]:
    """(dim, codec spec) -> relative error, for every dimension with tensors (dimensions
    that share one list of tensors, as the synthetic ones do, are coded once)."""
    done: dict[tuple[int, str], float | None] = {}
    out = {}
    for dim, tensors in by_dim.items():
        for spec in specs:
            key = (id(tensors), spec)
            if key not in done:
                done[key] = 0.0 if spec == "none" else relative_error(spec, tensors)
            out[(dim, spec)] = done[key]
    return out
