"""Our torch ZFP against the ZFP library (zfpy): the same bytes, and each decodes the other.

zfpy is the reference: for a float32 array of shape (n/4, 4) at rate R its stream is a
12-byte header, then 2 R bytes per block of 16 values, then zero padding to 8 bytes. Our
payload must equal those block bytes exactly, at every rate, for data of every kind.
"""

from __future__ import annotations

import pytest
import torch

from neoxlab.compress import make_compressor
from neoxlab.compress.zfp import layout, zfpy_header

zfpy = pytest.importorskip("zfpy")

RATES = list(range(1, 33))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def datasets() -> dict[str, torch.Tensor]:
    """Random, smooth, special and captured (a tiny MLP's gradients and activations)."""
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 10))
    acts: list[torch.Tensor] = []
    net[1].register_forward_hook(lambda m, i, o: acts.append(o.detach().reshape(-1)))
    loss = torch.nn.functional.cross_entropy(net(torch.randn(32, 24, generator=g)),
                                             torch.randint(0, 10, (32,), generator=g))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    t = torch.linspace(0, 25, 1200)
    special = torch.randn(640, generator=g)
    special[:16] = 0.0  # an all-zero block
    special[16:32] = torch.randn(16, generator=g) * 1e-33  # scale 2^(30-emax) overflows fp32
    special[32:48] = torch.randn(16, generator=g) * 1e-40  # subnormal block
    special[48:64] = torch.randn(16, generator=g) * 3e37  # near the fp32 maximum
    special[64:80] = torch.tensor([2.0**k for k in range(-8, 8)])  # exact powers of two
    special[80:96] = -1.0
    return {
        "random": torch.randn(1000, generator=g) * 5,
        "smooth": torch.sin(t) + 0.01 * t,
        "special": special,
        "grads": grads,
        "acts": acts[0],
    }


def zfpy_stream(x: torch.Tensor, rate: int) -> bytes:
    n4, _, _ = layout(x.numel())
    return zfpy.compress_numpy(x[:n4].float().reshape(-1, 4).numpy(), rate=rate)


def coded(c, x: torch.Tensor) -> torch.Tensor:
    """The codec's own payload, also where encode_fixed would send the raw bytes instead
    (rate 32, tiny tensors: not smaller than raw)."""
    out = torch.empty(c.coded_nbytes(x.numel(), x.dtype), dtype=torch.uint8)
    c._encode_fixed(x.reshape(-1).contiguous(), out)
    return out


def decoded(c, payload: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(n, dtype=dtype)
    c._decode_fixed(payload, out)
    return out


def stream_part(x: torch.Tensor, rate: int, payload: torch.Tensor) -> torch.Tensor:
    _, nblocks, _ = layout(x.numel())
    return payload[: 2 * rate * nblocks]


@pytest.mark.parametrize("rate", RATES)
def test_same_bytes_as_zfpy_and_cross_decodes(rate: int, datasets) -> None:
    ours = make_compressor("zfp", rate=rate, impl="torch")
    lib = make_compressor("zfp", rate=rate, impl="zfpy")
    for name, data in datasets.items():
        # whole blocks; 5 and 15 rows (ZFP pads a partial block); 3 values left over; and
        # the whole set (random: 250 rows; grads: 2 values left over)
        for n in sorted({data.numel() // 16 * 16, 20, 63, data.numel()}):
            x = data[:n].contiguous()
            payload = coded(ours, x)
            fixed = ours.encode_fixed(x)
            assert fixed.numel() == ours.fixed_nbytes(n, x.dtype) <= x.nbytes
            assert torch.equal(fixed, payload if payload.numel() < x.nbytes
                               else x.view(torch.uint8))
            stream = zfpy_stream(x, rate)
            blocks = stream_part(x, rate, payload)
            assert stream[:12] == zfpy_header(layout(n)[0], rate)
            assert bytes(blocks.numpy()) == stream[12: 12 + blocks.numel()], (name, n)
            assert torch.equal(coded(lib, x), payload), (name, n)
            # we decode zfpy's stream, zfpy decodes ours: bit-identical values
            ref = torch.from_numpy(zfpy.decompress_numpy(stream).reshape(-1).copy())
            from_lib = torch.frombuffer(bytearray(stream[12: 12 + blocks.numel()]),
                                        dtype=torch.uint8)
            mine = decoded(ours, torch.cat([from_lib, payload[blocks.numel():]]), n, x.dtype)
            assert torch.equal(mine[: ref.numel()].view(torch.int32), ref.view(torch.int32))
            assert torch.equal(mine[ref.numel():], x[ref.numel():])  # leftover values raw
            theirs = decoded(lib, payload, n, x.dtype)
            assert torch.equal(theirs.view(torch.int32), mine.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rate", [1, 5, 8, 12, 15])
def test_half_inputs_code_their_fp32_values(dtype: torch.dtype, rate: int, datasets) -> None:
    """fp16/bf16 are upcast exactly, so the stream is zfpy's on the upcast values."""
    c = make_compressor("zfp", rate=rate, impl="torch")
    for data in datasets.values():
        x = data.to(dtype).nan_to_num(posinf=0.0, neginf=0.0)  # in the half's range
        payload = c.encode_fixed(x)
        assert payload.numel() == c.fixed_nbytes(x.numel(), dtype) == c.coded_nbytes(
            x.numel(), dtype)
        blocks = stream_part(x, rate, payload)
        assert bytes(blocks.numpy()) == zfpy_stream(x.float(), rate)[12: 12 + blocks.numel()]
        y = c.decode_fixed(payload, x.numel(), dtype)
        ref = make_compressor("zfp", rate=rate, impl="torch").decode_fixed(
            c.encode_fixed(x.float()), x.numel(), torch.float32)
        n4 = layout(x.numel())[0]
        assert torch.equal(y[:n4], ref[:n4].to(dtype))
        assert torch.equal(y[n4:], x[n4:])


@pytest.mark.parametrize("impl", ["torch", "zfpy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_block_is_marked_never_finite(impl: str, bad: float, datasets) -> None:
    c = make_compressor("zfp", rate=8, impl=impl)
    x = datasets["random"][:999].clone()  # 62 blocks and 3 leftover values
    clean = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype)
    x[100] = bad  # block 6 (values 96..111)
    x[997] = bad  # a leftover value, sent raw
    y = c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype)
    assert bool(torch.isnan(y[96:112]).all())
    assert torch.equal(y[997:998].isnan() | y[997:998].isinf(), torch.tensor([True]))
    keep = torch.ones(999, dtype=torch.bool)
    keep[96:112] = False
    keep[997] = False
    assert torch.equal(y[keep], clean[keep])  # other blocks are untouched
    assert bool(torch.isfinite(y[keep]).all())


def test_rate_that_cannot_shrink_skips_the_encode(monkeypatch) -> None:
    """zfp rate >= 16 on fp16/bf16 (and 32 on fp32) is sent raw before any coding."""
    from neoxlab.compress import zfp_torch

    def boom(*args, **kwargs):
        raise AssertionError("encoded although the rate cannot shrink this dtype")

    monkeypatch.setattr(zfp_torch, "encode", boom)
    for rate, dtype in [(16, torch.float16), (20, torch.bfloat16), (32, torch.float32)]:
        c = make_compressor("zfp", rate=rate, impl="torch")
        assert c.shrinks(dtype) is False
        x = torch.randn(4096).to(dtype)
        assert torch.equal(c.decode(c.encode(x)), x)
        assert c.stats.passthrough == 1
    assert make_compressor("zfp", rate=15).shrinks(torch.float16)
    assert make_compressor("fp16").shrinks(torch.bfloat16) is False
    assert make_compressor("mpc").shrinks(torch.float32) is None


@pytest.mark.parametrize("rate", [1, 2, 3, 7, 8, 16, 31, 32])
def test_we_decode_arbitrary_streams_as_zfpy_does(rate: int) -> None:
    """Random bits are a valid ZFP stream: they exercise every code the decoder's tables
    know (long group tests, codes cut by the budget) beyond what real data reaches."""
    g = torch.Generator().manual_seed(rate)
    n4 = 16 * 300
    payload = torch.randint(0, 256, (2 * rate * 300,), dtype=torch.uint8, generator=g)
    head = payload.view(300, 2 * rate)
    head[:, 0] |= 2  # biased exponent odd, so never 0 (our NaN mark)
    head[:, 1] &= 0xFE  # and below 128: no block near the fp32 maximum
    head[::7, 0] &= 0xFE  # and some all-zero blocks
    stream = zfpy_header(n4, rate) + bytes(payload.numpy()) + bytes(-(12 + payload.numel()) % 8)
    ref = torch.from_numpy(zfpy.decompress_numpy(stream).reshape(-1).copy())
    mine = decoded(make_compressor("zfp", rate=rate, impl="torch"), payload, n4, torch.float32)
    assert torch.equal(mine.view(torch.int32), ref.view(torch.int32))
