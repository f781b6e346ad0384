"""The lean path's prepacked products: F.linear's results (to fp32 rounding) from
min_rows() rows on (4 on one thread, 8 on more), and from one row through any_rows;
F.linear itself below and off the CPU's fp32, and a weight changed in place is packed again."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neoxlab.serve import packed_linear
from neoxlab.serve.packed_linear import MIN_ROWS, MIN_ROWS_ONE_THREAD, PackedLinear, min_rows

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="no oneDNN in torch")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def test_the_threshold_follows_the_thread_count(threads):
    assert min_rows() == (MIN_ROWS_ONE_THREAD if threads == 1 else MIN_ROWS)


def test_packed_products_equal_f_linear_from_min_rows(threads):
    torch.manual_seed(0)
    linear = PackedLinear()
    w, b = torch.randn(96, 64), torch.randn(96)
    for shape in ((min_rows(), 64), (3, 7, 64), (1, 40, 64)):
        x = torch.randn(shape)
        got = linear(x, w, b)
        assert got.shape == (*shape[:-1], 96)
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert list(linear.packs) == [id(w)]  # one pack per weight, made once


def test_few_rows_and_other_dtypes_take_f_linear_unchanged(threads):
    linear = PackedLinear()
    w, b = torch.randn(32, 16), torch.randn(32)
    x = torch.randn(min_rows() - 1, 16)
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    xb, wb = torch.randn(min_rows() * 2, 16).bfloat16(), w.bfloat16()
    assert torch.equal(linear(xb, wb), F.linear(xb, wb))
    assert linear.packs == {}


def test_a_weight_changed_in_place_is_packed_again():
    linear = PackedLinear()
    w = torch.randn(32, 16)
    x = torch.randn(min_rows(), 16)
    first = linear(x, w)
    with torch.no_grad():
        w.mul_(2.0)  # e.g. checkpoint weights loaded into the built model
    torch.testing.assert_close(linear(x, w), 2.0 * first, rtol=1e-5, atol=1e-5)


def test_any_rows_packs_few_rows_too_and_equals_f_linear(threads):
    """The products of decode buckets timed faster packed (ServeModel._decode_fastest), from
    one row on: F.linear's results to fp32 rounding, each row its own (no row mixing)."""
    torch.manual_seed(1)
    linear = PackedLinear()
    w, b = torch.randn(96, 64), torch.randn(96)
    for rows in range(1, 8):
        x = torch.randn(rows, 1, 64)
        got = linear.any_rows(x, w, b)
        assert got.shape == (rows, 1, 96)
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        for r in range(rows):  # a row alone gives that row's result
            torch.testing.assert_close(linear.any_rows(x[r:r + 1], w, b), got[r:r + 1],
                                       rtol=1e-5, atol=1e-5)
    assert list(linear.packs) == [id(w)]
    xb = torch.randn(2, 64).bfloat16()
    assert torch.equal(linear.any_rows(xb, w.bfloat16()), F.linear(xb, w.bfloat16()))
