"""Which kernels a fixed-rate codec runs per device (compress/kernels.py), decided from the
device's facts: Triton where it imports and supports the compute capability, the NVRTC
kernels where it does not (POWER9, Volta under a CUDA-13 Triton), torch ops last. The facts
are stated here as a machine would report them; the decision is the real function."""

from __future__ import annotations

import pytest
import torch

from neoxlab.compress import kernels, nvrtc_host
from neoxlab.compress.kernels import Choice, DeviceFacts, decide

LASSEN = DeviceFacts("cuda", machine="ppc64le", capability=(7, 0), triton=False, nvrtc=True)
H100 = DeviceFacts("cuda", machine="x86_64", capability=(9, 0), triton=True, nvrtc=True)


def test_lassen_runs_the_nvrtc_kernels():
    got = decide("auto", LASSEN)
    assert got == Choice("nvrtc", "Triton does not import (ppc64le: no Triton wheel)")
    assert got.line("cuda:0 (sm_70)") == ("[neoxlab] codec kernels on cuda:0 (sm_70): nvrtc "
                                          "(Triton does not import (ppc64le: no Triton wheel))")


def test_triton_where_it_runs_and_supports_the_device():
    assert decide("auto", H100) == Choice("triton", "Triton supports sm_90")


def test_a_device_below_the_installed_tritons_range_falls_back_with_its_reason():
    volta = DeviceFacts("cuda", machine="x86_64", capability=(7, 0), triton=True,
                        triton_min_capability=(7, 5), nvrtc=True)
    assert decide("auto", volta) == Choice(
        "nvrtc", "sm_70 is outside the installed Triton's range (compute capability >= 7.5)")
    no_nvrtc = DeviceFacts("cuda", capability=(6, 0), triton=True, nvrtc=False)
    got = decide("auto", no_nvrtc)
    assert got.kernels == "torch" and "sm_60 is outside" in got.reason
    assert "no libnvrtc" in got.reason


def test_torch_ops_without_triton_or_nvrtc_and_on_cpu():
    bare = DeviceFacts("cuda", machine="ppc64le", capability=(7, 0), triton=False, nvrtc=False)
    assert decide("auto", bare).kernels == "torch"
    assert decide("auto", DeviceFacts("cpu")) == Choice("torch", "cpu tensors")
    assert decide("compile", H100).kernels == "triton"


@pytest.mark.parametrize("mode", ["torch", "triton", "nvrtc"])
def test_the_environment_overrides_the_facts(mode):
    for facts in (LASSEN, H100, DeviceFacts("cpu")):
        assert decide(mode, facts) == Choice(mode, f"NEOXLAB_CODEC_KERNELS={mode}")


def test_decisions_are_reported_for_summary_json(monkeypatch):
    monkeypatch.setattr(kernels, "_DECISIONS", {})
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "nvrtc")
    assert kernels.fused_for(torch.device("cpu")) is nvrtc_host
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "torch")
    assert kernels.fused_for(torch.device("cpu")) is None
    assert kernels.report() == {"cpu": {"kernels": "torch",
                                        "reason": "NEOXLAB_CODEC_KERNELS=torch"}}


def test_an_unknown_choice_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "cuda")
    with pytest.raises(ValueError, match="'cuda' is not one of .*NEOXLAB_CODEC_KERNELS=torch"):
        kernels.choice()
