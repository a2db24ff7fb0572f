"""Nadaraya–Watson attention pooling: properties of the estimator, and the toy-problem demo."""

import json

import pytest
import torch

from tokennet.attention.pooling import AttentionPooling, average_pooling, nadaraya_watson
from tokennet.attention.scores import GaussianKernel, LaplaceKernel


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kernel", [GaussianKernel(0.5), LaplaceKernel(0.3)])
def test_weights_rows_sum_to_one(kernel):
    x, xi, yi = torch.rand(7, generator=_gen(0)), torch.rand(11, generator=_gen(1)), torch.randn(11)
    pred, w = nadaraya_watson(x, xi, yi, kernel)
    assert pred.shape == (7,) and w.shape == (7, 11)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(7))
    torch.testing.assert_close(pred, w @ yi)


def test_batched_matches_each_batch_alone():
    q, k = torch.randn(3, 4, 2, generator=_gen(0)), torch.randn(3, 6, 2, generator=_gen(1))
    v = torch.randn(3, 6, 5, generator=_gen(2))
    pool = AttentionPooling(GaussianKernel(0.8))
    out, w = pool(q, k, v, return_weights=True)
    assert out.shape == (3, 4, 5) and w.shape == (3, 4, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4))
    for b in range(3):
        out_b = pool(q[b : b + 1], k[b : b + 1], v[b : b + 1])
        torch.testing.assert_close(out[b], out_b[0])


def test_small_bandwidth_is_nearest_neighbour():
    keys = torch.arange(10, dtype=torch.float64)  # spacing 1
    values = torch.randn(10, generator=_gen(0), dtype=torch.float64)
    queries = torch.arange(10, dtype=torch.float64) + (torch.rand(10, generator=_gen(1)) - 0.5) * 0.8
    pred, w = nadaraya_watson(queries, keys, values, GaussianKernel(0.01))
    nearest = (queries[:, None] - keys[None, :]).abs().argmin(-1)
    torch.testing.assert_close(w, torch.nn.functional.one_hot(nearest, 10).double())
    torch.testing.assert_close(pred, values[nearest])


def test_large_bandwidth_is_average_pooling():
    x, xi = torch.rand(6, generator=_gen(0)) * 5, torch.rand(20, generator=_gen(1)) * 5
    yi = torch.randn(20, generator=_gen(2))
    pred, w = nadaraya_watson(x, xi, yi, GaussianKernel(1e4))
    torch.testing.assert_close(w, torch.full((6, 20), 1 / 20))
    torch.testing.assert_close(pred, average_pooling(x, yi))


def test_leave_one_out_mask():
    x = torch.rand(8, generator=_gen(0))
    y = torch.randn(8, generator=_gen(1))
    loo = ~torch.eye(8, dtype=torch.bool)
    _, w = nadaraya_watson(x, x, y, GaussianKernel(0.3), mask=loo)
    assert (w.diagonal() == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(8))
    empty = torch.zeros(8, 8, dtype=torch.bool)
    out = AttentionPooling(GaussianKernel(0.3))(x, x, y, mask=empty)
    assert torch.equal(out, torch.zeros(8))


def test_learnable_kernel_is_registered_and_trains():
    pool = AttentionPooling(GaussianKernel(1.0, learnable=True))
    assert [n for n, _ in pool.named_parameters()] == ["kernel.log_bandwidth"]
    x = torch.rand(10, generator=_gen(0))
    pool(x, x, torch.sin(6 * x), mask=~torch.eye(10, dtype=torch.bool)).sum().backward()
    assert pool.kernel.log_bandwidth.grad is not None


def test_average_pooling_shapes():
    out = average_pooling(torch.zeros(3), torch.tensor([1.0, 2.0, 6.0]))
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    v = torch.randn(2, 5, 4)
    out = average_pooling(torch.zeros(2, 3, 7), v)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out[:, 1], v.mean(1))


@pytest.mark.parametrize(
    "q, k, v, mask",
    [
        (torch.rand(3), torch.rand(4), torch.rand(5), None),  # N differs
        (torch.rand(3), torch.rand(1, 4, 1), torch.rand(1, 4, 1), None),  # mixed ranks
        (torch.rand(3), torch.rand(4), torch.rand(4), torch.ones(3, 5, dtype=torch.bool)),  # mask shape
        (torch.rand(3), torch.rand(4), torch.rand(4), torch.ones(3, 4)),  # float mask
    ],
)
def test_bad_inputs_raise(q, k, v, mask):
    with pytest.raises(ValueError):
        nadaraya_watson(q, k, v, GaussianKernel(), mask=mask)


def test_average_pooling_bad_shapes_raise():
    with pytest.raises(ValueError):
        average_pooling(torch.zeros(2, 3, 1), torch.zeros(4, 5, 1))


def test_run_demo_writes_figure_and_metrics(tmp_path):
    from tokennet.nadaraya_watson import run_demo

    metrics = run_demo(tmp_path / "nw", seed=0, n_train=40, n_test=20, epochs=3)
    png, js = tmp_path / "nw" / "nadaraya_watson.png", tmp_path / "nw" / "nadaraya_watson.json"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(js.read_text()) == metrics
    assert metrics["mse_nonparametric"] < metrics["mse_average"]
    assert metrics["mse_parametric"] < metrics["mse_average"]
    assert metrics["mse_parametric"] < metrics["mse_nonparametric"]  # learning the width beats the fixed one
    assert metrics["loo_loss_final"] < metrics["loo_loss_initial"]
    assert 0 < metrics["bandwidth_learned"] < metrics["bandwidth_nonparametric"]
