"""Strict-device mode: catch tensors handed to torch.distributed on the wrong device, on CPU.

An NCCL process group takes CUDA tensors only, but on a CPU-only machine every tensor is on
the CPU, so comparing devices finds nothing. In strict mode (NEOXLAB_STRICT_DEVICE=1, read
when the patch is installed) the compressed path runs under torch's default device "meta":
a tensor allocated without ``device=`` lands on meta instead of beside its payload, and the
checked raw collectives reject any tensor whose device differs from the payload's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import torch

STRICT_ENV = "NEOXLAB_STRICT_DEVICE"


class DeviceMismatchError(RuntimeError):
    """A collective got a tensor on another device than the payload it moves."""


class _Expected(threading.local):
    device: torch.device | None = None
    default: torch.device | None = None  # the default device outside strict mode


_expected = _Expected()


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0", "false")


@contextlib.contextmanager
def payload_device(device: torch.device, strict: bool) -> Iterator[None]:
    """Within: raw collectives must see only tensors on `device`; in strict mode, stray
    allocations (no device named) go to meta so that they are caught."""
    if not strict:
        yield
        return
    before = _expected.device, _expected.default
    _expected.device, _expected.default = device, torch.get_default_device()
    try:
        with torch.device("meta"):
            yield
    finally:
        _expected.device, _expected.default = before


@contextlib.contextmanager
def codec_scope() -> Iterator[None]:
    """Codec internals run with the default device they would have outside strict mode:
    the meta trap is for the collective code; a codec's payload is still checked where it
    reaches torch.distributed. (A host-staging codec allocates host scratch by default.)"""
    if _expected.default is None:
        yield
        return
    with torch.device(_expected.default):
        yield


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def check_devices(op: str, args: tuple, kwargs: dict) -> None:
    """Raise unless every tensor argument sits on the expected payload device."""
    want = _expected.device
    if want is None:
        return
    for t in (*_tensors(args), *_tensors(list(kwargs.values()))):
        if t.device != want:
            raise DeviceMismatchError(
                f"torch.distributed.{op} got a {t.dtype} tensor of shape {list(t.shape)} on "
                f"{t.device}, but the payload is on {want}: a process group serves one "
                "device (NCCL: CUDA only); allocate it with device=<payload>.device")


def checked(raw: SimpleNamespace) -> SimpleNamespace:
    """The raw collectives, each checking its tensors' devices first."""
    out = SimpleNamespace()
    for name, fn in vars(raw).items():
        setattr(out, name, _checked(name, fn))
    return out


def _checked(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        check_devices(name, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper
