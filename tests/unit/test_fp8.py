"""fp8 communication (compress/fp8.py): codes bit-exact against torch's own float8 dtypes,
exact round trips on the fp8 grid, non-finite blocks, the header, and the model pricing it
through the registry alone (every collective: test_codecs_in_collectives; stated wire
bits: test_codec_registry)."""

from __future__ import annotations

import math

import pytest
import torch

from neoxlab.compress import CompressionConfigError, decode_any, make_compressor
from neoxlab.config.compose import compose_experiment
from neoxlab.perfmodel.predict import predict

CODES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}  # the formats' largest finite values (OCP fp8 spec)


def split(payload: torch.Tensor, n: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    nblocks = -(-n // block)
    return payload[: 4 * nblocks].clone().view(torch.float32), payload[4 * nblocks:]


def reference(x: torch.Tensor, fmt: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, code bytes) by the documented rule, with torch's own float8 cast."""
    xf = x.float().reshape(-1)
    n = xf.numel()
    padded = torch.cat([xf, xf.new_zeros(-n % block)]).view(-1, block)
    amax = padded.abs().amax(1)
    inv = torch.nan_to_num(FMAX[fmt] / amax, nan=0.0, posinf=0.0)
    q = (padded * inv[:, None]).reshape(-1)[:n].clamp(-FMAX[fmt], FMAX[fmt])
    return amax / FMAX[fmt], q.to(CODES[fmt]).view(torch.uint8)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "block"), [(4096, 128), (1000, 128), (777, 32), (5, 5)])
def test_codes_and_scales_are_torchs_own_float8_casts(fmt, dtype, n, block):
    g = torch.Generator().manual_seed(n + block)
    x = (torch.randn(n, generator=g) * torch.logspace(-3, 3, n)).to(dtype)
    c = make_compressor(f"fp8:format={fmt},block={block}")
    assert torch.finfo(CODES[fmt]).max == FMAX[fmt] == c.fmax
    payload = c.encode_fixed(x)
    scales, codes = split(payload, n, block)
    want_scales, want_codes = reference(x, fmt, block)
    assert torch.equal(scales, want_scales)
    assert torch.equal(codes, want_codes)
    y = c.decode_fixed(payload, n, dtype)
    blockwise = scales.repeat_interleave(block)[:n]
    assert torch.equal(y, (want_codes.view(CODES[fmt]).float() * blockwise).to(dtype))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_values_on_the_fp8_grid_round_trip_bit_exact(fmt):
    """x = code * 2^k with each block holding +-FMAX * 2^k: the scale is exactly 2^k and
    every value comes back bit for bit, both wire forms."""
    block, nblocks = 64, 50
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 256, (nblocks, block), generator=g, dtype=torch.uint8)
    grid = codes.view(CODES[fmt]).float()
    grid = torch.where(torch.isfinite(grid), grid, 0.0)
    grid[:, 0] = torch.where(torch.arange(nblocks) % 2 == 0, FMAX[fmt], -FMAX[fmt])
    powers = torch.randint(-20, 20, (nblocks, 1), generator=g).float()
    x = (grid * torch.exp2(powers)).reshape(-1)
    c = make_compressor(f"fp8:format={fmt},block={block}")
    y = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype)
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))
    z = decode_any(c.encode(x))
    assert torch.equal(z.view(torch.int32), x.view(torch.int32))
    assert c.stats.passthrough == 0


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_value_makes_its_block_nonfinite_and_encode_sends_raw(fmt, bad):
    x = torch.randn(512)
    x[200] = bad
    c = make_compressor(f"fp8:format={fmt}")
    y = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype)
    assert not torch.isfinite(y[128:256]).any()  # the block of value 200
    assert torch.isfinite(y[:128]).all() and torch.isfinite(y[256:]).all()
    z = decode_any(c.encode(x))
    assert c.stats.passthrough == 1
    assert torch.equal(z.view(torch.int32), x.view(torch.int32))


def test_all_zero_and_tiny_blocks_decode_as_zeros():
    x = torch.cat([torch.zeros(128), torch.full((128,), 1e-45), torch.ones(128)])
    c = make_compressor("fp8")
    y = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype)
    assert torch.equal(y[:256], torch.zeros(256)) and torch.equal(y[256:], x[256:])


def test_the_header_carries_format_and_block():
    x = torch.randn(3, 100)
    c = make_compressor("fp8:format=e5m2,block=48")
    want = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype).reshape(3, 100)
    got = decode_any(c.encode(x))  # decoded by a default (e4m3, 128) instance
    assert got.shape == x.shape and torch.equal(got, want)
    assert c.describe() == "fp8(format=e5m2,block=48)"


@pytest.mark.parametrize(("spec", "bad"), [("fp8:format=e3m4", "e3m4"), ("fp8:block=0", "0"),
                                           ("fp8:scale=2", "scale")])
def test_bad_parameters_are_refused_with_a_fix(spec, bad):
    with pytest.raises(CompressionConfigError, match=bad) as err:
        make_compressor(spec)
    assert "use e.g." in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_device_path_writes_the_host_bytes(fmt):
    x = torch.randn(10_000, dtype=torch.bfloat16)
    c = make_compressor(f"fp8:format={fmt}")
    host = c.encode_fixed(x)
    dev = c.encode_fixed(x.cuda())
    assert torch.equal(dev.cpu(), host)
    assert torch.equal(c.decode_fixed(dev, x.numel(), x.dtype).cpu(),
                       c.decode_fixed(host, x.numel(), x.dtype))


def test_the_model_prices_fp8_through_its_cost_class():
    """Lassen's profile has no fp8 entry: the codec's cost class (int8) prices it, its
    stated wire bits give the ratio; nothing in the model names fp8."""
    base = compose_experiment("baseline_192gpu", [])
    fp8 = compose_experiment("baseline_192gpu", [
        "compression=per_dim", "compression.dims.dp.compressor=fp8"])
    plain, priced = predict(base), predict(fp8)
    assert priced.breakdown["codec"] > 0 and priced.breakdown["dp"] < plain.breakdown["dp"]
    assert any("fp8: no codecs.fp8" in n and "priced as int8" in n for n in priced.notes)
