"""The fused Triton kernels against the torch reference codecs, bit for bit, on CPU tensors
under Triton's interpreter (on a GPU, bench/device/device_check.sh runs the same checks on CUDA).
The quantisation kernels also get data made of exact ties, where only rounding half to even
gives torch's codes (random data hold almost none).

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
from neoxlab.compress.identity_vectors import data, same_values, ties  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN lanes


@pytest.fixture(autouse=True)
def interpreter_only():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET was set to something else before this module")


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


# int8 in blocks of 3 costs 7 bytes per 3 values: fp16/bf16 travel raw, with no rounding
TIE_CASES = [(spec, dtype) for spec in ("int8", "int4", "int8:block=3", "int4:block=64")
             for dtype in (torch.float32, torch.float16, torch.bfloat16)
             if not (spec == "int8:block=3" and dtype != torch.float32)]


@pytest.mark.parametrize(("spec", "dtype"), TIE_CASES,
                         ids=[f"{spec}-{str(dtype)[6:]}" for spec, dtype in TIE_CASES])
def test_quant_kernels_round_ties_to_even_as_torch(spec: str, dtype: torch.dtype,
                                                   monkeypatch) -> None:
    c = make_compressor(spec)
    x = ties(4 * c.block + c.block // 2 + 1, c.block, c.qmax, dtype)
    assert c.coded_nbytes(x.numel(), dtype) < x.numel() * dtype.itemsize  # coded, not raw
    # every value but each block's max is an exact tie once scaled (the data are what they say)
    blocks = x.float().split(c.block)
    scaled = torch.cat([b * (c.qmax / b.abs().max()) for b in blocks])
    firsts = torch.zeros_like(scaled, dtype=torch.bool)
    firsts[::c.block] = True
    assert torch.equal(scaled[~firsts].abs() % 1, torch.full_like(scaled[~firsts], 0.5))
    assert torch.equal(scaled[firsts].abs(), torch.full_like(scaled[firsts], c.qmax))
    both_ways(spec, x, monkeypatch)
# -- 64-bit addressing ---------------------------------------------------------------------
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from neoxlab.compress.triton_kernels import _value_index, _zfp_blocks  # noqa: E402


@triton.jit
def _block_probe(out_ptr, first, rows, LANES: tl.constexpr):
    """Stores the ZFP encoder's source indices of program `first`: the encoder's own index
    arithmetic (_zfp_blocks, _value_index), for messages too large to allocate here."""
    b, nr = _zfp_blocks(first + tl.program_id(0), rows, LANES)
    lanes = tl.arange(0, LANES) * 16
    for y in tl.static_range(4):
        for x in tl.static_range(4):
            tl.store(out_ptr + lanes + (y * 4 + x), _value_index(b, nr, y, x))


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
