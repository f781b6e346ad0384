"""Round-trip, bound, passthrough and wire-format tests for neoxlab.compress.

Error bounds are restated here from each compressor's documented contract (not taken from
the code under test) and checked on random data and on gradients/activations captured
from a tiny real transformer.
"""

from __future__ import annotations

import math

import pytest
import torch

from neoxlab.compress import (
    CompressionConfigError,
    WireFormatError,
    available,
    decode_any,
    encoded_nbytes,
    make_compressor,
)
from neoxlab.compress.mpc import SLICE_WORDS

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
ALL_SPECS = ["none", "fp16", "bf16", "int8", "int4:block=64", "topk:ratio=0.05",
             "zfp:rate=8", "mpc", "mpc:dim=3"]
LOSSY_SPECS = [s for s in ALL_SPECS if s.split(":")[0] not in ("none", "mpc")]
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16, torch.float64: torch.int64}
# unit roundoff of the type a decoded value is cast back to
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(INT_VIEW[x.dtype])


@pytest.fixture(scope="module")
def captured() -> dict[str, torch.Tensor]:
    """Gradients and activations of a tiny transformer LM after one training step."""
    g = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    vocab, d, seq = 97, 48, 24
    emb = torch.nn.Embedding(vocab, d)
    layer = torch.nn.TransformerEncoderLayer(d, 4, 96, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    head = torch.nn.Linear(d, vocab)
    params = [*emb.parameters(), *enc.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    acts: list[torch.Tensor] = []
    enc.layers[0].register_forward_hook(lambda m, i, o: acts.append(o.detach().clone()))
    for _ in range(2):  # the second step's gradients come from a trained-one-step model
        acts.clear()
        opt.zero_grad()
        tok = torch.randint(0, vocab, (6, seq), generator=g)
        logits = head(enc(emb(tok)))
        target = tok.roll(-1, 1).reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target)
        loss.backward()
        opt.step()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    return {
        "grads": grads,
        "grad_matrix": enc.layers[1].linear1.weight.grad.clone(),
        "acts": acts[0].reshape(-1, d),
    }


def random_data(dtype: torch.dtype, n: int = 5000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 3).to(dtype)


def check_bound(spec: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """Assert y = decode(encode(x)) is within spec's documented error bound."""
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    if x.numel() == 0:
        return
    xf, yf = x.double().reshape(-1), y.double().reshape(-1)
    err = (xf - yf).abs()
    u = UNIT[x.dtype]
    name, _, arg = spec.partition(":")
    if name in ("none", "mpc"):
        assert torch.equal(bits(x), bits(y))
    elif name in ("fp16", "bf16"):
        rel = 2.0**-11 if name == "fp16" else 2.0**-8
        floor = 2.0**-25 if name == "fp16" else 2.0**-134
        assert bool((err <= (rel + u) * xf.abs() + floor).all())
    elif name in ("int8", "int4"):
        block = int(arg.split("=")[1]) if arg else 256
        qmax = 127 if name == "int8" else 7
        n = xf.numel()
        pad = torch.zeros(-n % block, dtype=torch.float64)
        amax = torch.cat([xf.abs(), pad]).view(-1, block).amax(1)
        scale = (amax / qmax).repeat_interleave(block)[:n]
        assert bool((err <= scale * 0.5 * (1 + 1e-5) + 2 * u * xf.abs() + 1e-30).all())
    elif name == "topk":
        k = max(1, math.ceil(float(arg.split("=")[1]) * xf.numel()))
        kth = xf.abs().topk(min(k, xf.numel())).values[-1]
        kept = yf != 0
        assert int(kept.sum()) <= k
        assert torch.equal(xf[kept], yf[kept])  # kept values are exact
        assert bool((xf.abs()[~kept] <= kth).all())
    elif name == "zfp":
        rate = int(arg.split("=")[1])
        rel_rms = float((xf - yf).norm() / xf.norm()) if xf.norm() > 0 else 0.0
        assert rel_rms <= 8 * 2.0**-rate + 2.0**-22 + u
    else:
        raise AssertionError(spec)


# -- round trips within bounds -----------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_roundtrip_random(spec: str, dtype: torch.dtype) -> None:
    c = make_compressor(spec)
    for shape in [(5000,), (37, 29), (3, 1, 257)]:
        x = random_data(dtype, math.prod(shape)).reshape(shape)
        check_bound(spec, x, c.decode(c.encode(x)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("which", ["grads", "grad_matrix", "acts"])
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_roundtrip_captured(spec: str, which: str, dtype: torch.dtype,
                            captured: dict[str, torch.Tensor]) -> None:
    x = captured[which].to(dtype)
    c = make_compressor(spec)
    buf = c.encode(x)
    check_bound(spec, x, c.decode(buf))
    if spec.split(":")[0] not in ("none", "mpc") and dtype == torch.float32:
        assert buf.numel() < x.numel() * x.element_size()  # lossy codecs really compress


@pytest.mark.parametrize("rate", [4, 8, 12, 16, 24])
def test_zfp_error_vs_rate(rate: int, captured: dict[str, torch.Tensor]) -> None:
    """Documented empirical bound: relative RMS error <= 8 * 2^-rate + 2^-22 (rate >= 4)."""
    smooth = torch.sin(torch.linspace(0, 40, 20000)) + 0.1 * torch.linspace(-1, 1, 20000)
    c = make_compressor({"name": "zfp", "rate": rate})
    errs = []
    for x in (smooth, random_data(torch.float32, 20000), captured["grads"], captured["acts"]):
        y = c.decode(c.encode(x))
        errs.append(float((x - y).norm() / x.norm()))
        check_bound(f"zfp:rate={rate}", x, y)
    assert errs[0] < errs[1]  # smooth data compresses far better than noise


def test_zfp_ratio_rate8_one_mib() -> None:
    x = random_data(torch.float32, (1 << 20) // 4)
    c = make_compressor("zfp:rate=8")
    ratio = x.nbytes / c.encode(x).numel()
    assert abs(ratio / 4 - 1) < 0.05
    assert c.stats.passthrough == 0


@pytest.mark.parametrize("rate", [2, 4, 16])
def test_zfp_ratio_follows_rate(rate: int) -> None:
    x = random_data(torch.float32, 1 << 16)
    ratio = x.nbytes / make_compressor("zfp", rate=rate).encode(x).numel()
    assert abs(ratio / (32 / rate) - 1) < 0.05


# -- lossless ------------------------------------------------------------------------------

SPECIALS32 = [0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x7F800000, 0xFF800000,
              0x80000000, 0x00000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x3F800000]
SPECIALS16 = [0x7E00, 0x7C01, 0xFFFF, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001, 0x83FF,
              0x7F80, 0xFF81, 0x7FC1, 0x0080, 0x007F]


def special_patterns(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        vals = [v - (1 << 32) if v >= 1 << 31 else v for v in SPECIALS32]
        return torch.tensor(vals, dtype=torch.int32).view(dtype)
    vals = [v - (1 << 16) if v >= 1 << 15 else v for v in SPECIALS16]
    return torch.tensor(vals, dtype=torch.int16).view(dtype)


def random_bits(dtype: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idt = INT_VIEW[dtype]
    info = torch.iinfo(idt)
    return torch.randint(info.min, info.max, (n,), dtype=idt, generator=g).view(dtype)


LOSSLESS = [s for s in ALL_SPECS if make_compressor(s).lossless]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", LOSSLESS)
@pytest.mark.parametrize("n", [1, 15, 33, 1000, SLICE_WORDS + 4001])
def test_lossless_random_bit_patterns(spec: str, dtype: torch.dtype, n: int) -> None:
    """Every bit pattern (NaN payloads, -0.0, Inf, subnormals) survives exactly."""
    x = random_bits(dtype, n, seed=n)
    sp = special_patterns(dtype)
    k = min(n, sp.numel())
    x.view(INT_VIEW[dtype])[:k] = sp.view(INT_VIEW[dtype])[:k]  # copy bits, not values
    c = make_compressor(spec)
    assert torch.equal(bits(c.decode(c.encode(x))), bits(x))


@pytest.mark.parametrize("dtype", [*FLOATS, torch.float64])
@pytest.mark.parametrize("dim", [1, 5])
def test_mpc_compresses_smooth_data_bit_exactly(dtype: torch.dtype, dim: int) -> None:
    n = SLICE_WORDS + 4001  # more than one internal slice, not a multiple of the chunk
    x = (torch.sin(torch.linspace(0, 30, n, dtype=torch.float64)) * 100).to(dtype)
    specials = special_patterns(dtype) if dtype != torch.float64 else torch.tensor(
        [math.nan, -0.0, math.inf, -math.inf, 5e-324], dtype=torch.float64)
    x.view(INT_VIEW[dtype])[1000: 1000 + specials.numel()] = specials.view(INT_VIEW[dtype])
    c = make_compressor("mpc", dim=dim)
    buf = c.encode(x)
    assert torch.equal(bits(c.decode(buf)), bits(x))
    assert c.stats.passthrough == 0
    assert buf.numel() < 0.9 * x.nbytes


def test_mpc_incompressible_falls_back_to_raw() -> None:
    x = random_bits(torch.float32, 4096)
    c = make_compressor("mpc")
    buf = c.encode(x)
    assert buf.numel() <= c.max_encoded_bytes(x.numel(), x.dtype)
    assert c.stats.passthrough == 1
    assert torch.equal(bits(c.decode(buf)), bits(x))


def test_mpc_transpose_is_a_bit_matrix_transpose() -> None:
    from neoxlab.compress.bitplanes import transpose_planes

    for idt, w in [(torch.int16, 16), (torch.int32, 32), (torch.int64, 64)]:
        info = torch.iinfo(idt)
        z = torch.randint(info.min, info.max, (w, 5), dtype=idt)  # 5 chunks, plane-major
        pos = torch.arange(w, dtype=torch.int64)
        before = (z.t().reshape(5, w, 1).long() >> pos) & 1  # [chunk, word, bit]
        after = transpose_planes(z.clone())
        got = (after.t().reshape(5, w, 1).long() >> pos) & 1
        assert torch.equal(got, before.transpose(1, 2))
        assert torch.equal(transpose_planes(after.clone()), z)


# -- edge cases ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (), (1,), (1, 1)])
def test_empty_and_single_element(spec: str, dtype: torch.dtype, shape: tuple) -> None:
    x = torch.full(shape, 1.7, dtype=dtype)
    c = make_compressor(spec)
    buf = c.encode(x)
    y = c.decode(buf)
    assert y.shape == x.shape and y.dtype == x.dtype
    check_bound(spec, x, y)
    assert buf.numel() <= c.max_encoded_bytes(x.numel(), dtype)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_non_contiguous_input(spec: str) -> None:
    base = random_data(torch.float32, 64 * 48).reshape(64, 48)
    for x in (base.t(), base[::2, 1::3]):
        assert not x.is_contiguous()
        c = make_compressor(spec)
        y = c.decode(c.encode(x))
        check_bound(spec, x, y)
        assert torch.equal(y, c.decode(c.encode(x.contiguous())))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("spec", LOSSY_SPECS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_passes_through(spec: str, dtype: torch.dtype, bad: float) -> None:
    x = random_data(dtype, 4000)
    x[1234] = bad
    c = make_compressor(spec)
    buf = c.encode(x)
    y = c.decode(buf)
    assert torch.equal(bits(y), bits(x))  # nothing finite was made up
    assert c.stats.passthrough == 1
    assert buf.numel() <= c.max_encoded_bytes(x.numel(), dtype)


def test_fp16_out_of_range_passes_through() -> None:
    c = make_compressor("fp16")
    x = random_data(torch.float32, 1000)
    for big in (70000.0, 65520.0, -1e30):  # would become +-Inf in fp16
        x[7] = big
        assert torch.equal(c.decode(c.encode(x)), x)
    assert c.stats.passthrough == 3
    for ok in (65504.0, 65519.0):  # still rounds to the largest finite fp16
        x[7] = ok
        y = c.decode(c.encode(x))
        check_bound("fp16", x, y)
        assert y[7] == 65504.0
    assert c.stats.passthrough == 3


@pytest.mark.parametrize("spec", ["int8", "int4", "int8:block=3"])
def test_quant_tiny_and_zero_blocks(spec: str) -> None:
    x = torch.zeros(1000)
    x[300:600] = 1e-40  # subnormal block: 127 / max|x| overflows fp32
    x[600:] = torch.linspace(-1e-30, 1e-30, 400)
    y = make_compressor(spec).decode(make_compressor(spec).encode(x))
    assert bool(torch.isfinite(y).all())
    assert bool(((x - y).abs()[300:600] <= 1e-36).all())  # documented: decode as zeros
    assert torch.equal(y[:300], x[:300])
    check_bound(spec, x, y)


@pytest.mark.parametrize("k", [1, 100, 3000])
def test_topk_sampled_selection_is_exact(k: int, captured: dict[str, torch.Tensor]) -> None:
    from neoxlab.compress.topk import topk_indices

    for mag in (captured["grads"].abs(), random_data(torch.float32, 200_000).abs(),
                torch.linspace(0, 1, 200_000) ** 4, torch.ones(200_000)):
        got = mag[topk_indices(mag, k)].sort().values
        assert torch.equal(got, mag.topk(k).values.sort().values)


def test_bf16_near_fp32_max_passes_through() -> None:
    c = make_compressor("bf16")
    x = torch.tensor([1.0, 3.4e38, -2.0])
    assert torch.equal(c.decode(c.encode(x)), x)
    assert c.stats.passthrough == 1


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_non_float_passes_through_untouched(spec: str) -> None:
    c = make_compressor(spec)
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randint(-2**62, 2**62, (100, 3), dtype=torch.int64, generator=g),
               torch.randint(0, 255, (77,), dtype=torch.uint8, generator=g),
               torch.randint(0, 2, (5, 5), generator=g).bool(),
               torch.tensor(7, dtype=torch.int32)]
    for x in tensors:
        y = c.decode(c.encode(x))
        assert y.dtype == x.dtype and torch.equal(y, x)
    assert c.stats.passthrough == len(tensors)


# -- sizes, stats, wire format ------------------------------------------------------------------

@pytest.mark.parametrize("spec", ALL_SPECS)
def test_max_encoded_bytes_bounds_actual(spec: str, captured: dict[str, torch.Tensor]) -> None:
    c = make_compressor(spec)
    cases = [random_data(torch.float32, 1), random_data(torch.float16, 3).reshape(3, 1),
             random_bits(torch.float32, 999), random_bits(torch.bfloat16, 4097),
             captured["grads"], captured["acts"].to(torch.float16),
             torch.zeros(0), torch.zeros(2, 3, 4, 5, 1, 2, 1, 3)]
    for x in cases:
        buf = c.encode(x)
        assert buf.dtype == torch.uint8 and buf.dim() == 1
        assert buf.numel() <= c.max_encoded_bytes(x.numel(), x.dtype)


def test_stats_count_wire_bytes() -> None:
    c = make_compressor("int8")
    xs = [random_data(torch.float32, 1000), random_data(torch.float16, 300)]
    total = sum(c.encode(x).numel() for x in xs)
    assert c.stats.calls == 2 and c.stats.bytes_out == total
    assert c.stats.bytes_in == sum(x.nbytes for x in xs)
    assert c.stats.ratio > 1.9
    c.stats.reset()
    assert c.stats.calls == 0 and c.stats.bytes_out == 0


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_decode_any_and_header_params(spec: str) -> None:
    x = random_data(torch.float32, 3000).reshape(30, 100)
    buf = make_compressor(spec).encode(x)
    assert torch.equal(decode_any(buf), make_compressor(spec).decode(buf))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_messages_are_self_delimiting(spec: str) -> None:
    """A message in a larger (e.g. max_encoded_bytes) slot decodes; a cut one is refused."""
    c = make_compressor(spec)
    for x in (random_data(torch.float32, 3001), torch.arange(10), captured_like_smooth()):
        buf = c.encode(x)
        assert encoded_nbytes(buf) == buf.numel()
        slot = torch.full((c.max_encoded_bytes(x.numel(), x.dtype) + 64,), 0xAB,
                          dtype=torch.uint8)
        slot[: buf.numel()] = buf
        assert encoded_nbytes(slot) == buf.numel()
        assert torch.equal(c.decode(slot), c.decode(buf))
        with pytest.raises(WireFormatError, match="truncated"):
            c.decode(buf[:-1])


def captured_like_smooth() -> torch.Tensor:
    return torch.sin(torch.linspace(0, 20, 5000)).reshape(50, 100)


def test_decoder_reads_params_from_header() -> None:
    x = random_data(torch.float32, 3000)
    buf = make_compressor("int8:block=64").encode(x)
    check_bound("int8:block=64", x, make_compressor("int8", block=1024).decode(buf))


def test_wrong_compressor_and_corrupt_buffers_are_rejected() -> None:
    x = random_data(torch.float32, 1000)
    buf = make_compressor("int8").encode(x)
    with pytest.raises(WireFormatError, match="int8|id"):
        make_compressor("fp16").decode(buf)
    bad = buf.clone()
    bad[0] = 0
    with pytest.raises(WireFormatError, match="magic"):
        decode_any(bad)
    with pytest.raises(WireFormatError):
        decode_any(buf[:10])


def test_spec_forms_and_describe() -> None:
    assert make_compressor("zfp:rate=8").describe() == "zfp(rate=8)"
    assert make_compressor({"name": "zfp", "rate": 8}).describe() == "zfp(rate=8)"
    assert make_compressor("int8", block=128).describe() == "int8(block=128)"
    assert make_compressor("topk:k=10").describe() == "topk(k=10)"
    assert make_compressor("none").describe() == "none"
    assert set(available()) >= {"none", "fp16", "bf16", "zfp", "mpc", "int8", "int4", "topk"}
    assert make_compressor("mpc").lossless and make_compressor("none").lossless
    assert not any(make_compressor(s).lossless for s in LOSSY_SPECS)


@pytest.mark.parametrize(("spec", "bad"), [
    ("zfp:rate=0", "0"), ("zfp:rate=33", "33"), ("zfp:rate=8.5", "8.5"),
    ({"name": "zfp", "rate": "high"}, "high"), ("int8:block=0", "0"), ("int4:block=7", "7"),
    ("topk:ratio=0", "0"), ("topk:ratio=1.5", "1.5"), ("topk:k=0", "0"),
    ("topk:k=5,ratio=0.1", "ratio"), ("mpc:dim=0", "0"), ("mpc:dim=65", "65"),
    ("zfp:rat=8", "rat"), ("fp16:scale=2", "scale"), ("gzip", "gzip"), ("zfp:rate", "rate"),
])
def test_bad_params_raise_config_error(spec: str | dict, bad: str) -> None:
    with pytest.raises(CompressionConfigError) as info:
        make_compressor(spec)
    msg = str(info.value)
    assert bad in msg and "use e.g." in msg


def test_zfp_rate_zero_message() -> None:
    with pytest.raises(CompressionConfigError, match=r"rate=0 is out of range.*\[1, 32\]"):
        make_compressor("zfp:rate=0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_cuda_round_trip_stays_on_device(spec: str) -> None:
    x = random_data(torch.float32, 10000).cuda()
    c = make_compressor(spec)
    buf = c.encode(x)
    assert buf.device == x.device
    y = c.decode(buf)
    assert y.device == x.device
    check_bound(spec, x.cpu(), y.cpu())
    assert c.stats.staged_to_host == 0  # every default codec runs on the device


@pytest.mark.parametrize("dtype", [*FLOATS, torch.float64])
def test_mpc_device_path_writes_the_same_bytes(dtype: torch.dtype, monkeypatch) -> None:
    """The whole-message path used on GPUs (one sync per encode, none per decode) writes
    and reads the host path's wire format exactly; run here on CPU tensors."""
    from neoxlab.compress import mpc

    n = SLICE_WORDS + 4001
    x = (torch.sin(torch.linspace(0, 30, n, dtype=torch.float64)) * 100).to(dtype)
    x[5] = math.nan
    for spec in ("mpc", "mpc:dim=3"):
        host = make_compressor(spec).encode(x)
        monkeypatch.setattr(mpc, "FORCE_DEVICE_PATH", True)
        c = make_compressor(spec)
        dev = c.encode(x)
        assert torch.equal(dev, host)
        assert torch.equal(bits(c.decode(host)), bits(x))
        noise = random_bits(dtype, 5000) if dtype != torch.float64 else torch.randn(5000)
        assert torch.equal(bits(c.decode(c.encode(noise))), bits(noise))
        monkeypatch.setattr(mpc, "FORCE_DEVICE_PATH", False)
