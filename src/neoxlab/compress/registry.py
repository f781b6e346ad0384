"""Compressors by name: registration decorator, spec parsing, ``decode_any``.

Specs come from Hydra configs and command lines, so both ``"zfp:rate=8"`` (several
parameters separated by commas: ``"topk:k=100"``) and ``{"name": "zfp", "rate": 8}`` are
accepted; keyword arguments override either.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

from neoxlab.compress.base import CompressionConfigError, Compressor, Header, WireFormatError

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
    cls = _BY_NAME.get(name)
    if cls is None:
        raise CompressionConfigError(
            f"unknown compressor {name!r}: the name must be one of {sorted(_BY_NAME)}; "
            "use e.g. 'zfp:rate=8'")
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
