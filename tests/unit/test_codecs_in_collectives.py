"""Every registered codec on the wire of every compressed collective (rank 0 of a group of 4
whose ranks all hold the same tensor: test_host_syncs' loopback wire), so a new codec is
checked in all of them by registering it. The reference is the same call with `none` (the
loopback's exact result, e.g. its all-to-all hands rank 0 its own first part from every
peer). Lossless codecs give it exactly; lossy ones stay within a few of their own round
trip's error (a collective codes a message and then its sum, each once per phase)."""

from __future__ import annotations

import pytest
import torch

from neoxlab.compress import available, make_compressor
from neoxlab.compress.registry import codec_type
from tests.unit.test_host_syncs import CALL_NUMEL, OPS, one_call, smooth

N = 4
EXAMPLES = [codec_type(n).example() for n in available()]


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("spec", EXAMPLES)
@pytest.mark.parametrize("op", OPS)
def test_every_codec_in_every_collective(spec: str, op: str) -> None:
    c = make_compressor(spec)
    _, x, got = one_call(op, spec, N)
    if op == "send":  # the sender's tensor is left as it was
        assert torch.equal(got, x)
        return
    want = one_call(op, "none", N)[2]
    if op == "reduce_scatter":  # rank 0's part
        want, got = want[: CALL_NUMEL // N], got[: CALL_NUMEL // N]
    if op.startswith(("all_reduce", "reduce")):  # sums: the reference is not the input
        assert not torch.equal(want[: x.numel()], x)
    view = got
    assert view.shape == want.shape and bool(torch.isfinite(view).all()), (spec, op)
    if c.lossless:
        assert torch.equal(view, want), (spec, op)
        return
    sample = smooth(CALL_NUMEL)
    once = rel_error(c.decode(c.encode(sample)), sample)
    assert rel_error(view, want) <= 4 * once + 1e-6, (spec, op, once)
