"""What the tuner may try: per parallel dimension, a codec with the collective options that go
with it, each expressed as the config values a compression scheme holds.

A candidate is one dimension's setting (compression.dims.<dim>) plus the options it needs of
the whole run: the compressed all-reduce's algorithm (compression.allreduce, shared by TP
and DP), DP's zero.reduce_to_owner and its error feedback. A scheme is one candidate per
dimension whose shared options agree. The control class ("other") is never compressed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from neoxlab.comm.compression_rules import validate_compression
from neoxlab.comm.scheme import communication_dtype
from neoxlab.compress import CompressionConfigError, make_compressor, parse_spec
from neoxlab.compress.registry import tune_candidates
from neoxlab.config import Config, DimCompressionConfig
from neoxlab.engines.registry import engine_of
from neoxlab.layout import Layout

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CONTROL = "other"


@dataclass(frozen=True)
class Candidate:
    dim: str  # tp | pp | dp | zero
    codec: str  # a compressor spec: "none", "zfp:rate=8", "int8"
    allreduce: str | None = None  # compression.allreduce it runs under (None: any)
    reduce_to_owner: bool | None = None  # zero.reduce_to_owner (dp only; None: any)
    error_feedback: bool = False  # dp only, lossy codecs only

    @property
    def compressed(self) -> bool:
        return self.codec != "none"

    @property
    def label(self) -> str:
        parts = [self.codec]
        if self.allreduce is not None:
            parts.append(f"allreduce={self.allreduce}")
        if self.reduce_to_owner:
            parts.append("reduce_to_owner")
        if self.error_feedback:
            parts.append("error_feedback")
        return " ".join(parts)

    def setting(self, min_bytes: int) -> DimCompressionConfig:
        name, params = parse_spec(self.codec)
        return DimCompressionConfig(compressor=name, params=params, min_bytes=min_bytes,
                                    error_feedback=self.error_feedback)


@dataclass(frozen=True)
class Excluded:
    """A dimension or candidate not tried, and why (shown in the report)."""

    dim: str
    codec: str
    reason: str


@dataclass
class Scheme:
    """One candidate per tuned dimension (a missing one: uncompressed)."""

    name: str
    parts: dict[str, Candidate] = field(default_factory=dict)

    @property
    def allreduce(self) -> str:
        chosen = {c.allreduce for c in self.parts.values() if c.allreduce is not None}
        return chosen.pop() if len(chosen) == 1 else "auto"

    @property
    def reduce_to_owner(self) -> bool | None:
        dp = self.parts.get("dp")
        return None if dp is None else dp.reduce_to_owner

    def consistent(self) -> bool:
        """Its dimensions agree on the shared all-reduce algorithm."""
        return len({c.allreduce for c in self.parts.values() if c.allreduce is not None}) <= 1

    @property
    def label(self) -> str:
        shown = [f"{d}={c.label}" for d, c in sorted(self.parts.items()) if c.compressed
                 or c.reduce_to_owner]
        return ", ".join(shown) or "none"


# Harsh candidates, offered beside the registry's so the guard has something to reject:
# ZFP rate 2 (harmful on every dimension of the loss-vs-rate map) and top-k at 1 % (drops 99 %
# of a message). Kept here, apart from the codecs' own tune_specs (issue 54).
HARSH = ("zfp:rate=2", "topk:ratio=0.01")


def tune_codecs(cfg: Config) -> list[str]:
    """The specs the tuner tries: tune.codecs, or every registered codec's candidates and the
    harsh ones when it names none (a new codec is tried without a config change)."""
    if cfg.tune.codecs:
        return list(cfg.tune.codecs)
    return list(dict.fromkeys([*tune_candidates(), *HARSH]))


def active_dims(cfg: Config, layout: Layout) -> dict[str, str | None]:
    """Every compressible dimension -> None when this layout sends traffic on it, else why
    it does not."""
    return {
        "tp": None if layout.tp > 1 else "tp=1: no tensor-parallel traffic",
        "pp": None if layout.pp > 1 else "pp=1: no pipeline traffic",
        "dp": None if layout.dp > 1 else "dp=1: no gradient reduction",
        "zero": (None if layout.dp > 1 and cfg.zero.stage >= 1 else
                 "no ZeRO parameter all-gather (zero.stage=0 or dp=1)"),
    }


def dim_dtype(cfg: Config, dim: str) -> torch.dtype:
    """What a dimension's messages are made of: DP gradients travel in the communication
    dtype, activations and ZeRO's parameters in the training precision."""
    name = communication_dtype(cfg) if dim == "dp" else cfg.train.precision
    return DTYPES[name]


def enumerate_candidates(cfg: Config, layout: Layout) -> tuple[list[Candidate], list[Excluded]]:
    """Every candidate of the dimensions cfg.tune.dims names, and what was left out (with
    the control class, which is never compressed)."""
    t = cfg.tune
    out: list[Candidate] = []
    excluded = [Excluded(CONTROL, "none", "control traffic: never compressed")]
    owners = _reduce_to_owner_options(cfg)
    for dim, idle in active_dims(cfg, layout).items():
        if dim not in t.dims:
            excluded.append(Excluded(dim, "none", "not in tune.dims"))
            continue
        if idle:
            excluded.append(Excluded(dim, "none", idle))
            continue
        dtype = dim_dtype(cfg, dim)
        for spec in tune_codecs(cfg):
            reason = _unusable(spec, dtype)
            if reason:
                excluded.append(Excluded(dim, spec, reason))
                continue
            out += _options(dim, spec, cfg, owners)
    return out, excluded


def _reduce_to_owner_options(cfg: Config) -> list[bool]:
    """zero.reduce_to_owner runs only under ZeRO-1/2 with reduce_scatter (layout.validate)."""
    z = cfg.zero
    if z.stage in (1, 2) and z.reduce_scatter and engine_of(cfg).reduces_to_owners:
        return list(dict.fromkeys(cfg.tune.reduce_to_owner))
    return [False]


def _unusable(spec: str, dtype: torch.dtype) -> str | None:
    try:
        codec = make_compressor(spec)
    except CompressionConfigError as exc:
        return str(exc)
    if codec.name != "none" and codec.shrinks(dtype) is False:
        return f"cannot shrink {str(dtype).removeprefix('torch.')} values (all sent raw)"
    return None


def _options(dim: str, spec: str, cfg: Config, owners: list[bool]) -> list[Candidate]:
    """A codec with every option that changes how it runs on this dimension."""
    t = cfg.tune
    compressed = spec != "none"
    algorithms = list(dict.fromkeys(t.allreduce)) if compressed else [None]
    if dim == "tp":
        return [Candidate(dim, spec, allreduce=a) for a in algorithms]
    if dim != "dp":
        return [Candidate(dim, spec)]
    lossy = compressed and not make_compressor(spec).lossless
    feedback = list(dict.fromkeys(t.error_feedback)) if lossy else [False]
    out = []
    for owner in owners:
        for ef in feedback:  # a reduce to owners runs no all-reduce: no algorithm to pick
            for a in ([None] if owner else algorithms):
                out.append(Candidate(dim, spec, allreduce=a, reduce_to_owner=owner,
                                     error_feedback=ef))
    return out


def apply(cfg: Config, scheme: Scheme) -> Config:
    """cfg with the scheme's compression (every tuned dimension named, uncompressed ones as
    none) and its zero.reduce_to_owner."""
    out = copy.deepcopy(cfg)
    c = out.compression
    c.scheme, c.backend, c.patch, c.allreduce = scheme.name, "framework", True, scheme.allreduce
    c.dims = {dim: (scheme.parts[dim].setting(cfg.tune.min_bytes) if dim in scheme.parts else
                    DimCompressionConfig(min_bytes=cfg.tune.min_bytes))
              for dim in ("dp", "zero", "tp", "pp")}
    if scheme.reduce_to_owner is not None:
        out.zero.reduce_to_owner = scheme.reduce_to_owner
    return out


def scheme_errors(cfg: Config, scheme: Scheme) -> list[str]:
    """The compression rules on the scheme applied to cfg (empty: it can run)."""
    if not scheme.consistent():
        return [f"{scheme.label}: its dimensions ask for different compression.allreduce"]
    return validate_compression(apply(cfg, scheme), trains=True)  # the runs tune starts train


def overrides(cfg: Config, scheme: Scheme) -> list[str]:
    """The scheme as command-line overrides of a run of the same experiment: every
    dimension's fields, from compression=per_dim (all four named, params empty)."""
    applied = apply(cfg, scheme)
    c = applied.compression
    out = ["compression=per_dim", f"compression.scheme={c.scheme}",
           "compression.backend=framework", "compression.patch=true",
           f"compression.allreduce={c.allreduce}",
           f"zero.reduce_to_owner={str(applied.zero.reduce_to_owner).lower()}"]
    for dim, d in c.dims.items():
        out += [f"compression.dims.{dim}.compressor={d.compressor}",
                f"compression.dims.{dim}.min_bytes={d.min_bytes}",
                f"compression.dims.{dim}.error_feedback={str(d.error_feedback).lower()}"]
        out += [f"+compression.dims.{dim}.params.{k}={v}" for k, v in sorted(d.params.items())]
    return out


SCHEME_KEYS = ("compression=", "compression.dims", "compression.scheme", "compression.allreduce",
               "compression.backend", "compression.patch", "zero.reduce_to_owner")


def without_scheme(args: list[str]) -> list[str]:
    """Command-line overrides less those a scheme sets (overrides() sets them all)."""
    return [a for a in args if not a.lstrip("+~").startswith(SCHEME_KEYS)]
