"""Compressors by name: registration, spec parsing, ``decode_any`` and the codecs' facts.

A codec registers itself (``@register(name, cid)``); a duplicate name or id, or an unknown
name, is refused. Everything outside compress/ that needs to know about codecs asks here
(``codec_type``, ``fused_codecs``, ``calibration_specs``, ``tune_candidates``,
``codec_table``) or asks a compressor instance (``wire_bits``, ``shrinks``,
``fixed_nbytes``), instead of comparing codec names.

Specs come from Hydra configs and command lines, so both ``"zfp:rate=8"`` (several
parameters separated by commas: ``"topk:k=100"``) and ``{"name": "zfp", "rate": 8}`` are
accepted; keyword arguments override either.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

from neoxlab.compress.base import CompressionConfigError, Compressor
from neoxlab.compress.wire import Header, WireFormatError

_BY_NAME: dict[str, type[Compressor]] = {}
_BY_ID: dict[int, type[Compressor]] = {}
_DECODERS: dict[int, Compressor] = {}


def register(name: str, cid: int) -> Callable[[type[Compressor]], type[Compressor]]:
    """Class decorator: make a compressor constructible by name and decodable by id."""

    def deco(cls: type[Compressor]) -> type[Compressor]:
        if name in _BY_NAME or cid in _BY_ID:
            raise RuntimeError(f"compressor name {name!r} or id {cid} registered twice")
        if not 0 < cid < 256:
            raise RuntimeError(f"compressor id {cid} must fit in one byte")
        cls.name = name
        cls.cid = cid
        _BY_NAME[name] = cls
        _BY_ID[cid] = cls
        return cls

    return deco


def codec_type(name: str) -> type[Compressor]:
    """The registered class of a codec name (its stated facts); unknown names are refused."""
    cls = _BY_NAME.get(name)
    if cls is None:
        raise CompressionConfigError(
            f"unknown compressor {name!r}: the name must be one of {sorted(_BY_NAME)}; "
            "use e.g. 'zfp:rate=8'")
    return cls


def fused_codecs() -> list[str]:
    """Names of the codecs with fused GPU kernels besides their torch-ops path."""
    return [n for n, c in _BY_NAME.items() if c.fused()]


def calibration_specs() -> dict[str, str]:
    """Profile key -> the spec calibration times for it, over every registered codec."""
    return {key: spec for c in _BY_NAME.values() for key, spec in c.calibration}


def tune_candidates() -> list[str]:
    """The specs task=tune tries when tune.codecs names none, in registration order."""
    return [spec for n, c in _BY_NAME.items() if _usable(c) for spec in c.tune_specs]


CODEC_TABLE_HEAD = ("| codec | lossless | wire bits per value (fp32 / fp16, default "
                    "parameters) | kernels | tuner candidates |\n|---|---|---|---|---|")


def codec_table() -> str:
    """The codecs as docs/compression.md shows them, one row each (a test compares)."""
    rows = [CODEC_TABLE_HEAD]
    for name, cls in _BY_NAME.items():
        c = cls()
        bits = [c.wire_bits(d) for d in (torch.float32, torch.float16)]
        shown = " / ".join("data-dependent" if b is None else f"{b:g}" for b in bits)
        rows.append(f"| `{name}` | {'yes' if cls.lossless else 'no'} | {shown} | "
                    f"{', '.join(cls.kernels)} | {', '.join(cls.tune_specs) or '-'} |")
    return "\n".join(rows)


def _usable(cls: type[Compressor]) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in cls.requires)


def available() -> list[str]:
    """Names of the registered compressors whose dependencies are importable."""
    return sorted(n for n, c in _BY_NAME.items() if _usable(c))


def parse_value(text: str) -> Any:
    """A command-line or table token as bool, int, float or the text itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``"int8:block=256"`` or ``{"name": "int8", "block": 256}`` -> ("int8", {...})."""
    if isinstance(spec, Mapping):
        params = dict(spec)
        if "name" not in params:
            raise CompressionConfigError(
                f"compressor spec {dict(spec)!r} has no 'name': a dict spec needs a name key; "
                "use e.g. {'name': 'zfp', 'rate': 8}")
        return str(params.pop("name")), params
    if not isinstance(spec, str):
        raise CompressionConfigError(
            f"compressor spec {spec!r} is a {type(spec).__name__}: a spec is a string or a "
            "dict; use e.g. 'zfp:rate=8'")
    name, _, rest = spec.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise CompressionConfigError(
                f"compressor spec {spec!r}: parameter {item!r} is not key=value; "
                "use e.g. 'zfp:rate=8' or 'topk:ratio=0.01'")
        params[key.strip()] = parse_value(val.strip())
    return name.strip(), params


def make_compressor(spec: str | Mapping[str, Any], **params: Any) -> Compressor:
    """Build a compressor from a spec; every parameter is validated by its constructor."""
    name, parsed = parse_spec(spec)
    parsed.update(params)
    cls = codec_type(name)
    if not _usable(cls):
        raise CompressionConfigError(
            f"compressor {name!r} needs the Python module(s) {list(cls.requires)}, which are "
            f"not importable; install them (pip install {' '.join(cls.requires)})")
    return cls(**parsed)


def compressor_class(cid: int) -> type[Compressor]:
    if cid not in _BY_ID:
        raise WireFormatError(f"unknown compressor id {cid} in header; known ids are "
                              f"{sorted(_BY_ID)}")
    return _BY_ID[cid]


def decode_any(buf: torch.Tensor) -> torch.Tensor:
    """Decode a wire buffer from any registered compressor (id read from its header)."""
    hdr, _ = Header.parse(buf)
    if hdr.cid not in _DECODERS:
        _DECODERS[hdr.cid] = compressor_class(hdr.cid)()
    return _DECODERS[hdr.cid].decode(buf)
