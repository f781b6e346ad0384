"""The fixed-size wire API: exact sizes, round trips, caller buffers, NaN/Inf marking, and
no device-to-host round trip inside encode_fixed/decode_fixed."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from neoxlab.compress import CompressionConfigError, WireFormatError, make_compressor
from tests.unit.test_compressors import check_bound

FIXED = ["none", "fp16", "bf16", "int8", "int4", "int8:block=3", "int4:block=64",
         "zfp:rate=1", "zfp:rate=8", "zfp:rate=19", "zfp:rate=32"]
LOSSY_FIXED = [s for s in FIXED if s != "none"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_cases(seed: int, count: int) -> list[torch.Tensor]:
    """Tensors of random shape (0-3 dims, 0-3000 values) and float dtype."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ndim = int(torch.randint(0, 4, (1,), generator=g))
        shape = tuple(int(v) for v in torch.randint(0, 16 if ndim > 1 else 3000, (ndim,),
                                                    generator=g))
        dtype = DTYPES[int(torch.randint(0, 3, (1,), generator=g))]
        out.append((torch.randn(shape, generator=g) * 4).to(dtype))
    return out


@pytest.mark.parametrize("spec", FIXED)
def test_size_function_equals_payload_and_round_trip_is_in_bound(spec: str) -> None:
    c = make_compressor(spec)
    for x in random_cases(seed=len(spec), count=12):
        nbytes = c.fixed_nbytes(x.numel(), x.dtype)
        payload = c.encode_fixed(x)
        assert payload.dtype == torch.uint8 and payload.dim() == 1
        assert payload.numel() == nbytes
        y = c.decode_fixed(payload, x.numel(), x.dtype)
        assert y.shape == (x.numel(),) and y.dtype == x.dtype
        if spec.startswith("zfp"):
            # passthrough-free: the rate's own error (rate 1-3 may exceed the signal)
            rate = int(spec.split("=")[1])
            if rate >= 4 and x.numel() and x.float().norm() > 0:
                err = float((x.double().reshape(-1) - y.double()).norm() / x.double().norm())
                assert err <= 8 * 2.0**-rate + 2.0**-22 + 2.0**-8
        else:
            check_bound(spec, x.reshape(-1), y)


@pytest.mark.parametrize("spec", FIXED)
def test_payload_is_smaller_exactly_when_shrinks_says_so(spec: str) -> None:
    c = make_compressor(spec)
    for dtype in DTYPES:
        n = 1 << 16
        smaller = c.fixed_nbytes(n, dtype) < n * dtype.itemsize
        assert smaller == bool(c.shrinks(dtype)), (spec, dtype)


@pytest.mark.parametrize(("spec", "dtype"), [("zfp:rate=16", torch.float16),
                                             ("zfp:rate=24", torch.bfloat16),
                                             ("zfp:rate=32", torch.float32),
                                             ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_rate_that_cannot_shrink_sends_raw_without_coding(spec: str, dtype: torch.dtype,
                                                            monkeypatch) -> None:
    c = make_compressor(spec)

    def boom(*args, **kwargs):
        raise AssertionError("coded although the raw bytes are not larger")

    monkeypatch.setattr(c, "_encode_fixed", boom)
    monkeypatch.setattr(c, "_decode_fixed", boom)
    x = (torch.randn(4096) * 2).to(dtype)
    payload = c.encode_fixed(x)
    assert torch.equal(payload, x.view(torch.uint8))
    assert torch.equal(c.decode_fixed(payload, x.numel(), dtype), x)
    assert c.stats.passthrough == 1  # counted as raw


def test_payload_never_exceeds_raw() -> None:
    for spec in FIXED:
        c = make_compressor(spec)
        for n in (1, 3, 5, 17, 20, 63, 1000):
            for dtype in DTYPES:
                assert c.fixed_nbytes(n, dtype) <= n * dtype.itemsize


def test_other_dtypes_travel_raw() -> None:
    for spec in FIXED:
        c = make_compressor(spec)
        for x in (torch.arange(-50, 50, dtype=torch.int64), torch.rand(7, dtype=torch.float64),
                  torch.tensor([True, False, True])):
            if spec == "none" or x.dtype != torch.float64:
                assert c.fixed_nbytes(x.numel(), x.dtype) == x.numel() * x.element_size()
            payload = c.encode_fixed(x)
            assert payload.numel() == c.fixed_nbytes(x.numel(), x.dtype)
            assert torch.equal(c.decode_fixed(payload, x.numel(), x.dtype), x.reshape(-1))


@pytest.mark.parametrize("spec", FIXED)
def test_caller_buffers_at_offsets(spec: str) -> None:
    """encode into a slice of a larger (e.g. all-gather) buffer, decode into out=."""
    c = make_compressor(spec)
    x = (torch.randn(37, 29) * 2).T  # non-contiguous
    n = c.fixed_nbytes(x.numel(), x.dtype)
    for offset in (0, 3, 8):
        big = torch.full((offset + n + 5,), 0xAB, dtype=torch.uint8)
        got = c.encode_fixed(x, out=big[offset: offset + n])
        assert got.data_ptr() == big[offset:].data_ptr()
        assert torch.equal(got, c.encode_fixed(x))
        assert bool((big[offset + n:] == 0xAB).all()) and bool((big[:offset] == 0xAB).all())
        out = torch.empty(x.numel(), dtype=x.dtype)
        y = c.decode_fixed(big[offset:], x.numel(), x.dtype, out=out)  # trailing bytes ok
        assert y is out
        assert torch.equal(out, c.decode_fixed(c.encode_fixed(x), x.numel(), x.dtype))
    with pytest.raises(ValueError, match=f"{n} bytes"):
        c.encode_fixed(x, out=torch.empty(n + 1, dtype=torch.uint8))
    with pytest.raises(WireFormatError, match=f"at least {n} bytes"):
        c.decode_fixed(torch.empty(n - 1, dtype=torch.uint8), x.numel(), x.dtype)


def test_data_dependent_codecs_have_no_fixed_size() -> None:
    for spec in ("mpc", "topk:ratio=0.1"):
        c = make_compressor(spec)
        assert c.fixed_nbytes(100, torch.float32) is None
        with pytest.raises(CompressionConfigError, match="data-dependent"):
            c.encode_fixed(torch.ones(100))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", LOSSY_FIXED)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_values_never_decode_finite(spec: str, dtype: torch.dtype, bad: float) -> None:
    c = make_compressor(spec)
    x = (torch.randn(4003) * 3).to(dtype)
    for pos in (0, 1234, 4001):  # first block, a middle one, a leftover value
        x[pos] = bad
    y = c.decode_fixed(c.encode_fixed(x), x.numel(), dtype)
    assert not bool(torch.isfinite(y[[0, 1234, 4001]]).any())


def test_cast_overflow_becomes_inf_not_finite() -> None:
    c = make_compressor("fp16")
    x = torch.tensor([1.0, 70000.0, -1e30, 65504.0])
    y = c.decode_fixed(c.encode_fixed(x), 4, torch.float32)
    assert torch.equal(y, torch.tensor([1.0, math.inf, -math.inf, 65504.0]))


# -- no host round trips ----------------------------------------------------------------------

@contextlib.contextmanager
def no_host_round_trips():
    """Fail on any tensor -> host read or host sync (item, tolist, cpu, numpy, bool, int,
    float, nonzero) while active."""
    patched = {}

    def forbid(name):
        def fail(*args, **kwargs):
            raise AssertionError(f"host round trip: {name} called in a fixed-size codec")
        return fail

    targets = [(torch.Tensor, m) for m in ("item", "tolist", "cpu", "numpy", "__bool__",
                                           "__int__", "__float__", "__index__", "nonzero")]
    targets += [(torch, "nonzero")]
    for owner, name in targets:
        patched[(owner, name)] = getattr(owner, name)
        setattr(owner, name, forbid(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for (owner, name), orig in patched.items():
            setattr(owner, name, orig)


def test_guard_catches_a_sync() -> None:
    x = torch.ones(3)
    with no_host_round_trips(), pytest.raises(AssertionError, match="host round trip"):
        bool(x.sum() > 0)
    with no_host_round_trips(), pytest.raises(AssertionError, match="host round trip"):
        x.tolist()
    assert bool(x.sum() > 0)  # restored


@pytest.mark.parametrize("spec", ["zfp:rate=8,impl=torch", "zfp:rate=1,impl=torch", "int8",
                                  "int4", "fp16", "bf16", "none"])
def test_fixed_path_has_no_host_round_trip(spec: str) -> None:
    c = make_compressor(spec)
    for dtype in DTYPES:
        x = (torch.randn(5003) * 2).to(dtype)
        x[77] = math.nan
        out = torch.empty_like(x)
        with no_host_round_trips():
            payload = c.encode_fixed(x)
            c.decode_fixed(payload, x.numel(), dtype, out=out)
        assert torch.isnan(out[77])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", FIXED)
def test_cuda_payloads_and_values_equal_cpu(spec: str) -> None:
    """On CUDA (fused Triton kernels where available) the bytes and decoded values are the
    CPU reference's; NaN must meet NaN (NaN bits differ between devices)."""
    c = make_compressor(spec)
    for dtype in DTYPES:
        x = (torch.randn(100_003) * 3).to(dtype)
        x[17] = math.nan
        x[48:64] = 1e-30
        cpu = c.encode_fixed(x)
        gpu = c.encode_fixed(x.cuda())
        assert gpu.device.type == "cuda"
        assert torch.equal(gpu.cpu(), cpu), (spec, dtype)
        y_cpu = c.decode_fixed(cpu, x.numel(), dtype)
        y_gpu = c.decode_fixed(gpu, x.numel(), dtype).cpu()
        nan = y_cpu.isnan()
        assert torch.equal(nan, y_gpu.isnan())
        ints = {torch.float32: torch.int32}.get(dtype, torch.int16)
        assert torch.equal(y_cpu.view(ints)[~nan], y_gpu.view(ints)[~nan]), (spec, dtype)


@pytest.mark.parametrize("spec", ["zfp:rate=8", "int4", "fp16"])
def test_strided_payload_decodes(spec: str) -> None:
    c = make_compressor(spec)
    x = torch.randn(999)
    payload = c.encode_fixed(x)
    spread = torch.zeros(2 * payload.numel(), dtype=torch.uint8)
    spread[::2] = payload
    assert torch.equal(c.decode_fixed(spread[::2], 999, x.dtype),
                       c.decode_fixed(payload, 999, x.dtype))
