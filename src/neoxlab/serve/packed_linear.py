"""The lean path's linear layers with weights prepacked once for oneDNN (CPU, fp32).

F.linear hands the weight to the BLAS as it is stored, and from a few rows up the BLAS
repacks it on every call: at decode sizes that repacking costs more than the product. On
this project's CPU a 24-row product with a 512 x 2048 weight took 0.81 ms through F.linear
and 0.38 ms prepacked (`bench/packed_linear.py` prints the table); a fused decode step is
mostly such products. Below MIN_ROWS rows F.linear takes a matrix-vector path that is
faster than the packed product, so those calls (a sequential step) stay on it; on one thread
that path is slower and the packed product wins from MIN_ROWS_ONE_THREAD rows. A weight is
packed at first use and again when it changes (its version counter), so weights loaded
after the model was built are picked up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# from these rows on the packed product wins (bench/packed_linear.py, the block's four
# products): 8 at 2 threads (1.08-1.14x at 8 rows, 0.84-0.95x at 4-7); 4 at 1 thread
# (1.26-1.71x at 4-7 rows, 0.69-0.72x at 2-3)
MIN_ROWS, MIN_ROWS_ONE_THREAD = 8, 4
# decode steps from these rows are timed both ways (ServeModel._decode_fastest), below
# min_rows() too: whole steps ran faster packed than min_rows() implies (hidden 256,
# 6 layers: 1.2-1.6x at 2-3 rows; hidden 512, 8 layers: 1.7-2.4x; 1 and 2 threads). Rows
# padded to their bucket were never faster than packed on the real rows, so none are padded.
TIMED_FROM = 2


def min_rows() -> int:
    """The packing threshold for this process's torch thread count."""
    return MIN_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else MIN_ROWS


def row_bucket(rows: int) -> int:
    """The power of two at or above `rows`: a decode batch size class."""
    return 1 << (rows - 1).bit_length()


def available() -> bool:
    """oneDNN and its prepacked linear are in this torch build."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                             "_reorder_linear_weight")


class PackedLinear:
    """F.linear's signature; prepacked products for fp32 host tensors of min_rows()+ rows."""

    def __init__(self) -> None:
        self.packs: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._linear(x, weight, bias, min_rows())

    def any_rows(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        """As a call, but packed from one row: for the decode row buckets whose whole step
        was timed faster packed (ServeModel._decode_fastest), few rows included."""
        return self._linear(x, weight, bias, 1)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                least_rows: int) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows < least_rows or x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, weight, bias)
        return self.product(x, weight, bias)

    def product(self, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """The prepacked product whatever the rows (fp32 host tensors)."""
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, x.shape[-1]), self.packed(weight), bias, "none", [], "")
        return out.view(*x.shape[:-1], weight.shape[0])

    def packed(self, weight: torch.Tensor) -> torch.Tensor:
        entry = self.packs.get(id(weight))
        if entry is None or entry[0] is not weight or entry[1] != weight._version:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), MIN_ROWS)
            entry = self.packs[id(weight)] = (weight, weight._version, packed)
        return entry[2]
