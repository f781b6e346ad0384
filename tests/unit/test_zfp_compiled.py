"""The block-per-lane ZFP stages (zfp_fused.py) and their torch.compile'd CPU path
(zfp_compiled.py, NEOXLAB_CODEC_KERNELS=compile) write the reference coder's bytes.

The stages are checked eagerly at every rate against zfp_torch (itself checked against
zfpy in test_zfp_torch.py); one test compiles them (one rate: compiling costs a minute or
two) and compares the codec's payload and values with the eager reference.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from neoxlab.compress import make_compressor, zfp_compiled, zfp_fused, zfp_torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def special_blocks(nblocks: int = 96) -> torch.Tensor:
    """(nblocks, 16) fp32: random magnitudes over the fp32 range plus ZFP's edge cases."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(nblocks * 16, generator=g)
    x = x * torch.exp2(torch.randint(-140, 120, (nblocks, 1), generator=g).float()).repeat(
        1, 16).view(-1)
    x[:16] = 0.0  # all-zero block
    x[16:32] = torch.randn(16, generator=g) * 1e-33  # 2^(30 - emax) overflows fp32
    x[32:48] = torch.randn(16, generator=g) * 1e-40  # subnormal block
    x[48:64] = 3.4e38  # near the fp32 maximum
    x[64:80] = -(2.0**31)
    x[80] = float("nan")
    x[100] = float("inf")
    x[120:136] = torch.tensor([2.0**k for k in range(-8, 8)])
    return x.view(nblocks, 16)


@pytest.mark.parametrize("rate", list(range(1, 33)))
def test_fused_stages_write_the_reference_bytes(rate: int) -> None:
    fb = special_blocks()
    ref = zfp_torch._encode_chunk(fb, rate)
    ours = zfp_fused.encode_chunk(fb, rate, zfp_torch._encode_table(fb.device))
    assert torch.equal(ours, ref)
    want = zfp_torch._decode_chunk(ref, rate)
    got = zfp_fused.decode_chunk(ref, rate, zfp_torch._decode_table(fb.device))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # NaNs included


def _codec_roundtrip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = make_compressor("zfp", rate=8, impl="torch")
    payload = torch.empty(c.coded_nbytes(x.numel(), x.dtype), dtype=torch.uint8)
    c._encode_fixed(x, payload)
    out = torch.empty_like(x)
    c._decode_fixed(payload, out)
    return payload, out


def test_compiled_coder_matches_eager(monkeypatch) -> None:
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no C++ compiler for torch.compile: {err}")
    # several chunks, a partial last chunk and a padded last block (rows % 4 == 3)
    x = torch.cat([special_blocks().reshape(-1), torch.randn(2 * 16 * 1000 + 12) * 3])
    monkeypatch.setattr(zfp_compiled, "CHUNK_BLOCKS", 1024)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "torch")
    want_payload, want = _codec_roundtrip(x)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "compile")
    payload, got = _codec_roundtrip(x)
    assert not zfp_compiled._DISABLED, zfp_compiled._DISABLED  # it compiled, no fallback
    assert torch.equal(payload, want_payload)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_without_a_compiler_falls_back_to_eager_with_a_warning(monkeypatch, caplog) -> None:
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(zfp_compiled, "_STAGES", {})
    monkeypatch.setattr(zfp_compiled, "_DISABLED", [])
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "torch")
    x = torch.randn(4000)
    want_payload, want = _codec_roundtrip(x)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "compile")
    with caplog.at_level(logging.WARNING, logger="neoxlab.compress.zfp_compiled"):
        payload, got = _codec_roundtrip(x)
    assert "torch.compile unavailable" in caplog.text
    assert torch.equal(payload, want_payload) and torch.equal(got, want)


@pytest.mark.skipif(importlib.util.find_spec("zfpy") is None, reason="zfpy not installed")
def test_auto_takes_the_compiled_coder_on_cpu_only_when_asked(monkeypatch) -> None:
    """impl=auto hands host tensors to zfpy, unless the compiled coder (faster than zfpy
    here, bench/compressors.py) was asked for."""
    c = make_compressor("zfp", rate=8)
    cpu = torch.device("cpu")
    monkeypatch.delenv("NEOXLAB_CODEC_KERNELS", raising=False)
    assert c.impl_for(cpu) == "zfpy"
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "compile")
    assert c.impl_for(cpu) == "torch"
    assert c.impl_for(torch.device("meta")) == "torch"
