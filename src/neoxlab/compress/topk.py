"""Top-k sparsification: send the k largest-magnitude values and their int32 indices.

Body: k int32 indices, then the k values in the original dtype (kept exactly). Without
error feedback (which belongs to the caller, as it needs state across steps) the dropped
values are simply lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from neoxlab.compress.base import CompressionConfigError, Compressor, checked_size, finite_absmax
from neoxlab.compress.registry import register
from neoxlab.compress.wire import Header, WireFormatError, header_nbytes, view_as

_MAX_INDEX = 2**31 - 1
_SAMPLE = 1 << 15


def topk_indices(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries of mag (exact, in no particular order).

    torch.topk with a large k is slow on CPU (0.34 s for 1 % of 16 M values on one thread).
    A strided sample gives a threshold that keeps ~1.5k candidates; topk then runs on those
    only (10x faster). Exact: if at least k values are >= the threshold, the k largest are
    all among them; otherwise fall back to the full topk. Host tensors only: the count of
    candidates is a host sync, and a device's topk is fast anyway.
    """
    n = mag.numel()
    if n > 4 * _SAMPLE and k < n // 8 and _host_path(mag.device):
        sample = mag[:: n // _SAMPLE]
        want = min(sample.numel(), math.ceil(sample.numel() * k / n * 1.5) + 8)
        threshold = torch.kthvalue(sample, sample.numel() - want + 1).values
        cand = (mag >= threshold).nonzero().squeeze(1)
        if cand.numel() >= k:
            return cand[_topk(mag[cand], k)]
    return _topk(mag, k)


def _topk(mag: torch.Tensor, k: int) -> torch.Tensor:
    try:
        return torch.topk(mag, k, sorted=False).indices
    except RuntimeError:  # torch < 2.2 (the oldest supported set) has no CPU topk for fp16
        return torch.topk(mag.float(), k, sorted=False).indices


# Host tensors may take the sampled threshold (a sync costs nothing there); devices do not.
# Tests flip this to run the device path on CPU.
FORCE_DEVICE_PATH = False


def _host_path(dev: torch.device) -> bool:
    return dev.type == "cpu" and not FORCE_DEVICE_PATH


@register("topk", cid=6)
class TopK(Compressor):
    """Keep k = ceil(ratio * numel) (or a fixed k, capped at numel) values.

    Error bound: kept values are exact; every dropped value satisfies |x_i| <= the k-th
    largest |x|, so ||x - x'||^2 <= (1 - k/n) ||x||^2. Messages whose (4 + itemsize) * k
    bytes would not be smaller than the raw tensor, tensors with more than 2^31 - 1
    elements (int32 indices) and NaN/Inf messages pass through.
    """

    def __init__(self, *, ratio: float | None = None, k: int | None = None,
                 **unknown: object) -> None:
        super().__init__(**unknown)
        if ratio is not None and k is not None:
            raise CompressionConfigError(
                f"topk got both ratio={ratio!r} and k={k!r}: give exactly one of them; "
                "use e.g. topk:ratio=0.01 or topk:k=1000")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise CompressionConfigError(
                    f"topk k={k!r} is invalid: k must be an integer >= 1; use e.g. topk:k=1000")
        else:
            ratio = 0.01 if ratio is None else ratio
            ok = isinstance(ratio, int | float) and not isinstance(ratio, bool)
            if not ok or not math.isfinite(ratio) or not 0 < ratio <= 1:
                raise CompressionConfigError(
                    f"topk ratio={ratio!r} is out of range: ratio must be a number in (0, 1] "
                    "(fraction of values kept); use e.g. topk:ratio=0.01")
            ratio = float(ratio)
        self.ratio, self.k = ratio, k

    @classmethod
    def param_names(cls) -> list[str]:
        return ["ratio", "k"]

    @classmethod
    def example(cls) -> str:
        return "topk:ratio=0.01"

    def params(self) -> dict[str, float | int]:
        return {"k": self.k} if self.k is not None else {"ratio": self.ratio}

    def keep(self, numel: int) -> int:
        """How many values a message of numel values keeps."""
        if self.k is not None:
            return min(self.k, numel)
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def wire_bits(self, dtype: torch.dtype) -> float | None:
        """A value and its int32 index per kept value; None for a fixed k (its share of a
        message depends on the message's size)."""
        return None if self.ratio is None else self.ratio * (8 * dtype.itemsize + 32)

    def _header_param(self, numel: int) -> int:
        return self.keep(numel)

    def _fixed_body_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.keep(numel) * (4 + dtype.itemsize)

    def _encode(self, flat: torch.Tensor, hdr: Header) -> torch.Tensor | None:
        n, k = flat.numel(), self.keep(flat.numel())
        if n > _MAX_INDEX or finite_absmax(flat) is None:
            return None
        return _pack(hdr, *_select(flat, k))

    def _coded(self, x: torch.Tensor) -> bool:
        """Whether x is coded when finite (else it always goes raw)."""
        n = x.numel()
        return (x.dtype in self.dtypes and 0 < n <= _MAX_INDEX
                and self._fixed_body_nbytes(n, x.dtype) < n * x.element_size())

    def payload_sizes(self, count: int, load: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """encode()'s sizes of `count` messages on their device, without a host sync: a
        message's size is fixed by k unless it holds NaN/Inf (then it goes raw)."""
        sizes = []
        for i in range(count):
            x = load(i).detach()
            hlen, raw_n = header_nbytes(x.dim()), x.numel() * x.element_size()
            raw = torch.full((), hlen + raw_n, dtype=torch.int64, device=x.device)
            if self._coded(x):
                coded = hlen + self._fixed_body_nbytes(x.numel(), x.dtype)
                lo, hi = torch.aminmax(x.reshape(-1))
                raw = torch.where(torch.isfinite(lo) & torch.isfinite(hi), coded, raw)
            sizes.append(raw)
        return torch.stack(sizes)

    def encode_sized(self, x: torch.Tensor, nbytes: int) -> torch.Tensor:
        """encode(x) when its size (payload_sizes) is known on the host: no host sync."""
        x = x.detach()
        flat = x.contiguous().reshape(-1)
        numel, hlen = flat.numel(), header_nbytes(x.dim())
        self.stats.calls += 1
        self.stats.bytes_in += numel * x.element_size()
        k = self.keep(numel)
        if self._coded(x) and nbytes == hlen + self._fixed_body_nbytes(numel, x.dtype):
            buf = _pack(Header(self.cid, x.dtype, tuple(x.shape), param=k), *_select(flat, k))
        else:
            buf = self._passthrough(flat, Header(self.cid, x.dtype, tuple(x.shape)))
        self.stats.bytes_out += buf.numel()
        return checked_size(self, buf, nbytes)

    def _decode(self, body: torch.Tensor, hdr: Header) -> torch.Tensor:
        k = hdr.param
        if body.numel() != k * (4 + hdr.dtype.itemsize):
            raise WireFormatError(f"topk body of {body.numel()} bytes does not hold k={k} "
                                  f"{hdr.dtype} values and int32 indices")
        idx = view_as(body[: 4 * k], torch.int32).long()
        vals = view_as(body[4 * k:], hdr.dtype)
        out = torch.zeros(hdr.numel, dtype=hdr.dtype, device=body.device)
        out[idx] = vals
        return out


def _select(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ascending indices, values) of the k largest magnitudes (ascending: sequential
    writes on decode)."""
    idx = topk_indices(flat.abs(), k).sort().values
    return idx, flat[idx]


def _pack(hdr: Header, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """The wire buffer: k int32 indices, then the k values."""
    k = idx.numel()
    buf, body = hdr.alloc(k * (4 + vals.element_size()), vals.device)
    body[: 4 * k].view(torch.int32).copy_(idx)
    body[4 * k:].view(vals.dtype).copy_(vals)
    return buf
