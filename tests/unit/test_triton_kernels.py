"""The fused Triton kernels against the torch reference codecs, bit for bit, on CPU tensors
under Triton's interpreter (on a GPU, bench/device_check.sh runs the same checks on CUDA).

NaN payloads are not compared bit for bit (CPUs and GPUs write different NaN bits, and
so does torch on either); a NaN must meet a NaN.
"""

from __future__ import annotations

import os

import pytest
import torch

# before triton is imported: its @jit functions (tl.max too) are then interpreted
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from neoxlab.compress import make_compressor  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN lanes
INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@pytest.fixture(autouse=True)
def interpreter_only():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET was set to something else before this module")


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    return torch.equal(a.view(INT[a.dtype])[~nan], b.view(INT[b.dtype])[~nan])


def both_ways(spec: str, x: torch.Tensor, monkeypatch) -> None:
    c = make_compressor(spec)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "torch")
    ref = c.encode_fixed(x)
    ref_y = c.decode_fixed(ref, x.numel(), x.dtype)
    monkeypatch.setenv("NEOXLAB_CODEC_KERNELS", "triton")
    got = c.encode_fixed(x)
    got_y = c.decode_fixed(ref, x.numel(), x.dtype)
    assert torch.equal(got, ref), spec
    assert same_values(got_y, ref_y), spec


def data(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3
    x[5] = float("nan")
    x[40:56] = torch.randn(16, generator=g) * 1e-36  # tiny block
    x[60:76] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("spec", ["int8", "int4", "int8:block=3", "int4:block=64"])
def test_quant_kernels_match_torch(spec: str, dtype: torch.dtype, monkeypatch) -> None:
    both_ways(spec, data(101 if spec.endswith("=3") else 1001, dtype), monkeypatch)


@pytest.mark.parametrize(("spec", "dtype"), [("zfp:rate=1,impl=torch", torch.float32),
                                             ("zfp:rate=8,impl=torch", torch.bfloat16),
                                             ("zfp:rate=31,impl=torch", torch.float32),
                                             ("zfp:rate=13,impl=torch", torch.float16)])
def test_zfp_kernels_match_torch(spec: str, dtype: torch.dtype, monkeypatch) -> None:
    both_ways(spec, data(211, dtype), monkeypatch)  # 13 blocks, the last padded; 3 left


# -- 64-bit addressing ---------------------------------------------------------------------
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from neoxlab.compress.triton_kernels import _zfp_blocks  # noqa: E402


@triton.jit
def _block_probe(out_ptr, first, rows, LANES: tl.constexpr):
    """Stores the ZFP encoder's source indices of program `first`: the encoder's own index
    arithmetic (_zfp_blocks), for messages too large to allocate here."""
    b, src = _zfp_blocks(first + tl.program_id(0), rows, LANES)
    lanes = tl.arange(0, LANES)[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + lanes, src)


@pytest.mark.parametrize("values", [(1 << 31) + 4096, (3 << 31) + 12345 * 16])
def test_zfp_encoder_addresses_messages_past_2_to_the_31_values(values):
    """The program holding value `values` of a message of 4 * 2^31 values: its source
    indices are the values' own, not wrapped around 32 bits."""
    lanes = 64
    first = values // 16 // lanes  # the program whose blocks hold that value
    out = torch.empty(lanes * 16, dtype=torch.int64)
    _block_probe[(1,)](out, first, 1 << 33, LANES=lanes)  # rows: 2^33 x 4 values
    block = first * lanes + torch.arange(lanes, dtype=torch.int64)[:, None]
    expected = block * 16 + torch.arange(16, dtype=torch.int64)[None, :]  # full blocks
    assert torch.equal(out.view(lanes, 16), expected)
    assert int(out.max()) > 1 << 31
