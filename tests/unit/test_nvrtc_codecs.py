"""The CUDA C codecs (compress/nvrtc_codecs.cu), without a GPU:

- the host build of the source (g++, ctypes: NEOXLAB_CODEC_KERNELS=nvrtc on CPU tensors)
  gives the torch reference's bytes and values at every spec and dtype the Triton tests
  use, and zfpy's bytes at every ZFP rate;
- NVRTC 11.8 compiles the device source for sm_70 (Lassen's V100, CUDA 11.8) and NVRTC
  12.x for sm_90; a syntax error fails compilation with NVRTC's log naming it. The NVRTC
  wheels come from `make nvrtc` (build/nvrtc/cu11|cu12); without them these tests skip,
  unless NEOXLAB_REQUIRE_NVRTC=1 (CI) turns the skip into a failure.

NaN payloads are compared as NaNs, not bit for bit (as in test_triton_kernels.py).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest
import torch

from neoxlab.compress import make_compressor, nvrtc, nvrtc_host
from neoxlab.compress.identity_vectors import data, same_values, ties

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
REPO = Path(__file__).resolve().parents[2]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """One host build per test session, in the session's own cache."""
    monkeypatch.setenv("NEOXLAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nx-cache"))


def against(spec: str, x: torch.Tensor, monkeypatch, reference: str = "torch") -> None:
    """Encode and decode with the host build of the CUDA C source and with the reference
    (torch ops, or zfpy with impl=zfpy): the same bytes, the same values."""
    ours = make_compressor(spec)
    ref_c = make_compressor(spec.replace("impl=torch", "impl=zfpy")) if reference == "zfpy" \
        else ours
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "torch")
    ref = ref_c.encode_fixed(x)
    ref_y = ref_c.decode_fixed(ref, x.numel(), x.dtype)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "nvrtc")
    got = ours.encode_fixed(x)
    got_y = ours.decode_fixed(ref, x.numel(), x.dtype)
    assert ref.numel() == ours.coded_nbytes(x.numel(), x.dtype) < x.numel() * x.itemsize
    assert torch.equal(got, ref), f"{spec} {x.dtype}: bytes differ at " \
        f"{(got != ref).nonzero().flatten()[:8].tolist()}"
    assert same_values(got_y, ref_y), f"{spec} {x.dtype}: decoded values differ"


def test_nvrtc_choice_on_cpu_runs_the_host_build(monkeypatch):
    """NEOXLAB_CODEC_KERNELS=nvrtc on CPU tensors is the g++ build, not the torch path."""
    from neoxlab.compress import kernels

    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "nvrtc")
    assert kernels.fused_for(torch.device("cpu")) is nvrtc_host
    assert nvrtc_host.library().nx_host_zfp_encode is not None


# -- the host build against the torch reference: the Triton tests' specs and dtypes ---------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", ["int8", "int4", "int8:block=3", "int4:block=64"])
def test_quant_host_build_matches_torch(spec, dtype, monkeypatch):
    x = data(101 if spec.endswith("=3") else 1001, dtype)
    if spec == "int8:block=3" and dtype != torch.float32:
        x = x.float()  # 7 bytes per 3 values do not shrink fp16/bf16 (sent raw)
    against(spec, x, monkeypatch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", ["int8", "int4", "int4:block=64"])
def test_quant_host_build_rounds_ties_to_even(spec, dtype, monkeypatch):
    c = make_compressor(spec)
    x = ties(4 * c.block + c.block // 2 + 1, c.block, c.qmax, dtype)
    scaled = x.float()[1: c.block] * (c.qmax / x.float()[: c.block].abs().max())
    assert torch.equal(scaled.abs() % 1, torch.full_like(scaled, 0.5))  # the data are ties
    against(spec, x, monkeypatch)


@pytest.mark.parametrize(("spec", "dtype"), [("zfp:rate=1,impl=torch", torch.float32),
                                             ("zfp:rate=8,impl=torch", torch.bfloat16),
                                             ("zfp:rate=31,impl=torch", torch.float32),
                                             ("zfp:rate=13,impl=torch", torch.float16)])
def test_zfp_host_build_matches_torch(spec, dtype, monkeypatch):
    against(spec, data(211, dtype), monkeypatch)  # 13 blocks, the last padded; 3 left


# -- the host build against zfpy --------------------------------------------------------------

@pytest.mark.parametrize("rate", range(1, 32))
def test_zfp_host_build_matches_zfpy_at_every_rate(rate, monkeypatch):
    """fp32 Gaussian, smooth and tiny values, a zero block and a padded last block: the
    bytes zfpy writes, and zfpy's values decoded from them."""
    pytest.importorskip("zfpy")
    g = torch.Generator().manual_seed(rate)
    x = torch.randn(4 * 67 + 2, generator=g) * 10.0 ** (rate % 7 - 3)
    x[64:128] = torch.linspace(-1, 1, 64) ** 3  # smooth
    x[16:32] = 0.0
    x[32:48] *= 1e-38  # subnormal range
    against(f"zfp:rate={rate},impl=torch", x, monkeypatch, reference="zfpy")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rate", [1, 8, 13])
def test_zfp_host_build_matches_zfpy_on_half_inputs(rate, dtype, monkeypatch):
    pytest.importorskip("zfpy")
    x = torch.randn(4 * 50, generator=torch.Generator().manual_seed(7)).to(dtype)
    against(f"zfp:rate={rate},impl=torch", x, monkeypatch, reference="zfpy")


# -- NVRTC: the device source compiles for Lassen's sm_70 (11.8) and sm_90 (12.x) -------------

def wheel_nvrtc(tag: str) -> str:
    found = sorted(glob.glob(str(REPO / "build" / "nvrtc" / tag / "nvidia" / "cuda_nvrtc"
                                 / "lib" / "libnvrtc.so.*")))
    found = [f for f in found if "builtins" not in f and ".alt." not in f]
    if not found:
        msg = f"no NVRTC {tag} in build/nvrtc/{tag} (run `make nvrtc`)"
        if os.environ.get("NEOXLAB_REQUIRE_NVRTC") == "1":
            pytest.fail(msg + "; NEOXLAB_REQUIRE_NVRTC=1")
        pytest.skip(msg)
    return found[0]


@pytest.mark.parametrize(("tag", "major", "arch"), [("cu11", 11, "sm_70"), ("cu12", 12, "sm_90")])
def test_nvrtc_compiles_the_device_source(tag, major, arch):
    nv = nvrtc.load(wheel_nvrtc(tag))
    assert nv.version[0] == major
    ptx = nv.compile(nvrtc.SOURCE.read_text(), arch).decode()
    assert f".target {arch}" in ptx
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", ptx))
    assert entries == {"nx_zfp_encode", "nx_zfp_decode", "nx_quant_encode", "nx_quant_decode"}
    assert "fma.rn.f32" not in ptx  # --fmad=false: no product fused into an add


def test_a_syntax_error_fails_nvrtc_and_names_it():
    nv = nvrtc.load(wheel_nvrtc("cu11"))
    broken = nvrtc.SOURCE.read_text().replace(
        "int maxbits = 16 * rate;", "int maxbits = 16 * rate +;", 1)
    assert broken != nvrtc.SOURCE.read_text()
    with pytest.raises(nvrtc.NvrtcError) as err:
        nv.compile(broken, "sm_70")
    line = 1 + broken[: broken.index("16 * rate +;")].count("\n")
    assert f"nvrtc_codecs.cu({line})" in str(err.value) and "error" in str(err.value)


def test_a_syntax_error_fails_the_host_build(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text(nvrtc.SOURCE.read_text().replace("nx_i32 ib[16];", "nx_i32 ib[16]", 1))
    with pytest.raises(RuntimeError, match="could not build"):
        nvrtc_host.build(broken, tmp_path)


def test_ptx_is_compiled_once_per_arch(tmp_path, monkeypatch):
    path = wheel_nvrtc("cu12")
    monkeypatch.setenv("NEOXLAB_CACHE_DIR", str(tmp_path))
    nv = nvrtc.load(path)
    first = nvrtc.ptx("sm_80", nv)
    cached = list((tmp_path / "nvrtc").glob("*-sm_80-nvrtc12.*.ptx"))
    assert len(cached) == 1 and cached[0].read_bytes() == first
    cached[0].write_bytes(b"// cached\0")
    assert nvrtc.ptx("sm_80", nv) == b"// cached\0"  # read back, not compiled again
