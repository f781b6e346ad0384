"""Which implementation a fixed-rate codec (ZFP, int8/int4) runs: fused Triton kernels, the
fused CUDA C kernels compiled with NVRTC, or torch ops.

NEOXLAB_CODEC_KERNELS=auto (default) decides per device (``decide``, from ``DeviceFacts``):
on a CUDA device, Triton where it imports and the installed Triton supports the device's
compute capability; else the NVRTC kernels where libnvrtc and the driver load (POWER9 has
no Triton wheel; Triton 3.x with CUDA 13's ptxas no longer targets Volta); else torch ops.
CPU tensors run torch ops. Overrides: =torch always torch ops; =triton always Triton, on CPU
tensors too, which needs TRITON_INTERPRET=1 (how the tests check the kernels without a
GPU); =nvrtc always the NVRTC kernels, on CPU tensors the g++ build of the same source
(nvrtc_host.py; how the tests check it without a GPU; use it on a GPU where
bench/device/device_codecs.py measures NVRTC faster than Triton); =compile as auto, but
ZFP on CPU tensors runs torch.compile'd coders (zfp_compiled.py, opt-in: minutes of
compiling). All produce the same bytes.

The first decision per device prints one line (``[neoxlab] codec kernels on cuda:0 (sm_70):
nvrtc (...)``); ``report()`` gives the decisions for summary.json.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import platform
import re
import subprocess
from functools import cache
from types import ModuleType

import torch

from neoxlab.compress import cuda_driver, nvrtc, nvrtc_host, nvrtc_kernels
from neoxlab.config.profile import TRITON_ARCHES

CHOICES = ("auto", "torch", "triton", "nvrtc", "compile")
# Triton's own floor for NVIDIA GPUs (its README: compute capability 7.0+); the ptxas it
# ships raises it: CUDA 13 dropped Maxwell, Pascal and Volta (7.5 is the lowest it targets)
TRITON_MIN_CAPABILITY = (7, 0)
PTXAS13_MIN_CAPABILITY = (7, 5)

_DECISIONS: dict[str, Choice] = {}


def choice() -> str:
    value = os.environ.get("NEOXLAB_CODEC_KERNELS", "auto")
    if value not in CHOICES:
        raise ValueError(f"NEOXLAB_CODEC_KERNELS={value!r} is not one of {list(CHOICES)}; "
                         "unset it or use e.g. NEOXLAB_CODEC_KERNELS=torch")
    return value


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the choice depends on, gathered by facts_for (tests state them directly)."""

    device_type: str  # "cuda", "cpu", ...
    machine: str = platform.machine()  # x86_64, aarch64, ppc64le
    capability: tuple[int, int] | None = None  # CUDA compute capability
    triton: bool = False  # Triton imports
    triton_min_capability: tuple[int, int] = TRITON_MIN_CAPABILITY
    nvrtc: bool = False  # libnvrtc and the CUDA driver load


@dataclasses.dataclass(frozen=True)
class Choice:
    kernels: str  # "triton", "nvrtc" or "torch"
    reason: str

    def line(self, where: str) -> str:
        return f"[neoxlab] codec kernels on {where}: {self.kernels} ({self.reason})"


def decide(mode: str, facts: DeviceFacts) -> Choice:
    """The kernels for tensors on a device with these facts (module doc)."""
    if mode == "torch":
        return Choice("torch", "NEOXLAB_CODEC_KERNELS=torch")
    if mode in ("triton", "nvrtc"):
        return Choice(mode, f"NEOXLAB_CODEC_KERNELS={mode}")
    if facts.device_type != "cuda":
        return Choice("torch", f"{facts.device_type} tensors")
    cc = facts.capability
    sm = f"sm_{cc[0]}{cc[1]}" if cc else "the device"
    if not facts.triton:
        why = f"Triton does not import ({facts.machine}"
        why += ": no Triton wheel)" if facts.machine not in TRITON_ARCHES else ")"
    elif cc is not None and cc < facts.triton_min_capability:
        lo = facts.triton_min_capability
        why = (f"{sm} is outside the installed Triton's range (compute capability >= "
               f"{lo[0]}.{lo[1]})")
    else:
        return Choice("triton", f"Triton supports {sm}")
    if facts.nvrtc:
        return Choice("nvrtc", why)
    return Choice("torch", why + "; no libnvrtc for the NVRTC kernels")


# a cluster's cluster.device as a compute capability, for deciding from its config
DEVICE_CAPABILITY = {"v100": (7, 0), "a100": (8, 0), "h100": (9, 0), "h200": (9, 0)}


def cluster_choice(device: str, arch: str, nvrtc: bool) -> Choice:
    """What auto would pick on a cluster's GPUs, decided from its config (cluster.device,
    cluster.arch; nvrtc: the profile prices an NVRTC path): planning and task=predict."""
    return decide("auto", DeviceFacts("cuda", machine=arch,
                                      capability=DEVICE_CAPABILITY.get(device),
                                      triton=arch in TRITON_ARCHES, nvrtc=nvrtc))


@cache
def triton_min_capability() -> tuple[int, int]:
    """The lowest compute capability the installed Triton compiles for (module constants)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return TRITON_MIN_CAPABILITY
    ptxas = os.path.join(spec.submodule_search_locations[0], "backends", "nvidia", "bin",
                         "ptxas")
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return TRITON_MIN_CAPABILITY
    found = re.search(r"release (\d+)\.", out)
    if found and int(found.group(1)) >= 13:
        return PTXAS13_MIN_CAPABILITY
    return TRITON_MIN_CAPABILITY


def facts_for(device: torch.device) -> DeviceFacts:
    if device.type != "cuda":
        return DeviceFacts(device.type)

    triton = importlib.util.find_spec("triton") is not None
    return DeviceFacts(
        "cuda", capability=tuple(torch.cuda.get_device_capability(device)), triton=triton,
        triton_min_capability=triton_min_capability() if triton else TRITON_MIN_CAPABILITY,
        nvrtc=nvrtc.available() and cuda_driver.available())


def chosen(device: torch.device) -> Choice:
    """The decision for tensors on device, made once per device (and mode) and printed."""
    mode = choice()
    key = f"{device}|{mode}"
    if key not in _DECISIONS:
        facts = facts_for(device)
        _DECISIONS[key] = decide(mode, facts)
        if device.type == "cuda":
            cc = facts.capability or (0, 0)
            print(_DECISIONS[key].line(f"{device} (sm_{cc[0]}{cc[1]})"), flush=True)
    return _DECISIONS[key]


def report() -> dict[str, dict[str, str]]:
    """The decisions made in this process, for summary.json: device -> kernels, reason."""
    return {key.split("|")[0]: dataclasses.asdict(c) for key, c in _DECISIONS.items()}


def fused_for(device: torch.device) -> ModuleType | None:
    """The fused kernel module (Triton, NVRTC or its host build) for tensors on device, or
    None for torch ops. All have the same functions (zfp_encode, quant_encode, ...)."""
    kind = chosen(device).kernels
    if kind == "torch":
        return None
    if kind == "nvrtc":
        if device.type == "cuda":
            return nvrtc_kernels
        return nvrtc_host
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("NEOXLAB_CODEC_KERNELS=triton but triton is not importable; "
                           "pip install triton or use NEOXLAB_CODEC_KERNELS=torch")
    # deferred: importing Triton costs seconds; only where its kernels run
    from neoxlab.compress import triton_kernels

    return triton_kernels


# the codecs' call sites (zfp.py, quant.py) predate the NVRTC path
triton_for = fused_for


def compiled_for(device: torch.device) -> bool:
    """Whether ZFP on device should run the torch.compile'd CPU coders (zfp_compiled.py)."""
    return device.type == "cpu" and choice() == "compile"
