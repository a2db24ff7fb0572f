"""gemv_rows: a linear layer traced by torch.compile is a one-pass sum of products for a few static rows, and a
matrix product inside symbolic_rows() (the serving engine's symbolic batch: its 2–4-row int8 graph decoded 6×
slower per step than the 1-row one as a loop over symbolic rows)."""

from __future__ import annotations

import torch

from tokennet.layers.blockquant import GEMV_ROWS, gemv_rows, symbolic_rows


def _branch(x: torch.Tensor) -> torch.Tensor:
    return x + (1.0 if gemv_rows(x) else 2.0)


def test_eager_never_takes_the_sum_of_products():
    assert not gemv_rows(torch.zeros(1, 8))


def test_static_rows_up_to_the_limit_take_it_and_symbolic_rows_do_not():
    torch._dynamo.reset()
    f = torch.compile(_branch, backend="eager", dynamic=False)
    assert f(torch.zeros(GEMV_ROWS, 8)).eq(1).all()
    assert f(torch.zeros(GEMV_ROWS + 1, 8)).eq(2).all()
    torch._dynamo.reset()
    g = torch.compile(_branch, backend="eager")
    x = torch.zeros(3, 8)
    torch._dynamo.mark_dynamic(x, 0)
    with symbolic_rows():  # the engine's batch from 2 rows on: the matrix product
        assert g(x).eq(2).all()
        y = torch.zeros(2, 8)
        torch._dynamo.mark_dynamic(y, 0)
        assert g(y).eq(2).all()
    assert f(torch.zeros(1, 8)).eq(1).all()  # outside it again: one static row is a sum of products
    with symbolic_rows(False):
        assert f(torch.zeros(2, 8)).eq(1).all()
