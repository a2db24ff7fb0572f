"""Scoring functions: each against a reference written here, plus the properties the lecture states."""

import math

import pytest
import torch

from tokennet.attention.functional import masked_softmax
from tokennet.attention.pooling import AttentionPooling
from tokennet.attention.scores import (
    SCORES,
    AdditiveScore,
    BoxcarKernel,
    DotProductScore,
    GaussianKernel,
    LaplaceKernel,
    score_function,
)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_dot_product_is_q_kT_over_sqrt_d():
    q, k = _rand(2, 3, 8, seed=1), _rand(2, 5, 8, seed=2)
    torch.testing.assert_close(DotProductScore()(q, k), q @ k.transpose(1, 2) / math.sqrt(8))
    torch.testing.assert_close(DotProductScore(scale=0.5)(q, k), 0.5 * q @ k.transpose(1, 2))


def test_dot_product_rejects_different_widths():
    with pytest.raises(ValueError, match="same width"):
        DotProductScore()(_rand(1, 3, 4), _rand(1, 3, 5))


def _additive(dq=3, dk=5, h=7):
    torch.manual_seed(0)
    return AdditiveScore(dq, dk, h).double()


def test_additive_matches_einsum_over_expanded_tensors():
    score = _additive()
    q, k = _rand(2, 4, 3, seed=1), _rand(2, 6, 5, seed=2)
    Wq, Wk, wv = score.W_q.weight, score.W_k.weight, score.w_v.weight[0]  # (h, dq), (h, dk), (h,)
    B, Nq, Nk = 2, 4, 6
    q_exp = q[:, :, None, :].expand(B, Nq, Nk, 3)  # every query paired with every key
    k_exp = k[:, None, :, :].expand(B, Nq, Nk, 5)
    hidden = torch.einsum("bijd,hd->bijh", q_exp, Wq) + torch.einsum("bijd,hd->bijh", k_exp, Wk)
    expected = torch.einsum("bijh,h->bij", torch.tanh(hidden), wv)
    torch.testing.assert_close(score(q, k), expected)


def test_additive_matches_per_pair_loop():
    score = _additive(dq=2, dk=3, h=4)
    q, k = _rand(1, 2, 2, seed=3), _rand(1, 3, 3, seed=4)
    Wq, Wk, wv = score.W_q.weight, score.W_k.weight, score.w_v.weight[0]
    out = score(q, k)
    assert out.shape == (1, 2, 3)
    for i in range(2):
        for j in range(3):
            a = wv @ torch.tanh(Wq @ q[0, i] + Wk @ k[0, j])
            torch.testing.assert_close(out[0, i, j], a)


def test_additive_parameter_names_and_width_check():
    score = AdditiveScore(3, 5, 7)
    assert {n for n, _ in score.named_parameters()} == {"W_q.weight", "W_k.weight", "w_v.weight"}
    with pytest.raises(ValueError, match="query width 3 and key width 5"):
        score(torch.randn(1, 2, 5), torch.randn(1, 2, 3))


def test_gaussian_softmax_is_normalized_kernel():
    sigma = 0.7
    x, xi = _rand(5, seed=1), _rand(9, seed=2)
    scores = GaussianKernel(sigma)(x[None, :, None], xi[None, :, None])[0]  # (5, 9)
    K = torch.exp(-((x[:, None] - xi[None, :]) ** 2) / (2 * sigma**2))
    torch.testing.assert_close(torch.softmax(scores, -1), K / K.sum(-1, keepdim=True))


def test_gaussian_multivariate_uses_squared_euclidean_distance():
    q, k = _rand(2, 3, 4, seed=1), _rand(2, 5, 4, seed=2)
    kernel = GaussianKernel(1.5).double()
    torch.testing.assert_close(kernel(q, k), -(torch.cdist(q, k) ** 2) / (2 * 1.5**2))


def test_laplace_softmax_is_normalized_kernel():
    sigma = 0.4
    x, xi = _rand(5, seed=1), _rand(9, seed=2)
    scores = LaplaceKernel(sigma)(x[None, :, None], xi[None, :, None])[0]
    K = torch.exp(-(x[:, None] - xi[None, :]).abs() / sigma)
    torch.testing.assert_close(torch.softmax(scores, -1), K / K.sum(-1, keepdim=True))


@pytest.mark.parametrize("cls", [GaussianKernel, LaplaceKernel])
def test_learnable_bandwidth_gets_gradient_and_stays_positive(cls):
    kernel = cls(0.5, learnable=True)
    assert [n for n, _ in kernel.named_parameters()] == ["log_bandwidth"]
    torch.testing.assert_close(kernel.bandwidth, torch.tensor(0.5))
    q = torch.randn(1, 4, 1)
    k = torch.cat([q[:, :2], torch.randn(1, 3, 1)], dim=1)  # q == k for two pairs: still finite
    q.requires_grad_(True)
    kernel(q, k).sum().backward()
    grad = kernel.log_bandwidth.grad
    assert grad is not None and torch.isfinite(grad) and grad != 0
    assert torch.isfinite(q.grad).all()


def test_fixed_bandwidth_is_not_a_parameter():
    kernel = GaussianKernel(2.0)
    assert list(kernel.parameters()) == []
    assert "log_bandwidth" in dict(kernel.named_buffers())


def test_boxcar_averages_keys_in_the_box_and_empty_box_gives_zeros():
    kernel = BoxcarKernel(width=1.0)
    keys = torch.tensor([0.0, 0.5, 2.0, 2.2])[None, :, None]  # (1, 4, 1)
    values = torch.tensor([1.0, 3.0, 10.0, 20.0])[None, :, None]
    queries = torch.tensor([0.2, 2.1, 10.0])[None, :, None]  # the last has no key within 1
    scores = kernel(queries, keys)
    weights = masked_softmax(scores, kernel.mask(queries, keys))
    expected = torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0, 0]])
    torch.testing.assert_close(weights[0], expected)
    out = AttentionPooling(kernel)(queries, keys, values)
    torch.testing.assert_close(out[0, :, 0], torch.tensor([2.0, 15.0, 0.0]))
    assert not torch.isnan(out).any()


def test_score_function_factory():
    assert isinstance(score_function("dot"), DotProductScore)
    assert isinstance(score_function("additive", query_dim=2, key_dim=3, hidden_dim=4), AdditiveScore)
    assert score_function("gaussian", bandwidth=0.3).bandwidth.item() == pytest.approx(0.3)
    assert isinstance(score_function("laplace"), LaplaceKernel)
    assert score_function("boxcar", width=2.0).width == 2.0
    assert set(SCORES) == {"dot", "additive", "gaussian", "laplace", "boxcar"}


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="dot, additive, gaussian, laplace, boxcar"):
        score_function("cosine")


@pytest.mark.parametrize(
    "make, q, k",
    [
        (lambda: GaussianKernel(), torch.randn(1, 2, 3), torch.randn(1, 2, 4)),
        (lambda: LaplaceKernel(), torch.randn(2, 3), torch.randn(3)),
        (lambda: DotProductScore(), torch.randn(2, 3, 4), torch.randn(3, 3, 4)),
        (lambda: BoxcarKernel(), torch.randn(4), torch.randn(4)),
    ],
)
def test_bad_shapes_raise(make, q, k):
    with pytest.raises(ValueError):
        make()(q, k)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GaussianKernel(0.0),
        lambda: LaplaceKernel(-1.0),
        lambda: BoxcarKernel(0.0),
        lambda: DotProductScore(scale=-1.0),
        lambda: AdditiveScore(0, 2, 2),
    ],
)
def test_bad_hyperparameters_raise(make):
    with pytest.raises(ValueError):
        make()
