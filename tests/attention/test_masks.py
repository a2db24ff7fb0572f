"""Boolean attention masks (True = may attend): each kind against its definition, shapes, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokennet.attention import masks

SETTINGS = settings(max_examples=30, deadline=None)


def _full(mask: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """The mask broadcast to ``(B, H, Nq, Nk)`` (raises if it does not broadcast)."""
    return mask.expand(shape) if mask.dim() == 4 else torch.broadcast_to(mask, shape)


# ---- causal ---------------------------------------------------------------------------------------


def test_causal_square_is_lower_triangular():
    m = masks.causal(5)
    assert m.dtype == torch.bool and m.shape == (5, 5)
    assert torch.equal(m, torch.ones(5, 5, dtype=torch.bool).tril())


@given(n_q=st.integers(1, 7), extra=st.integers(0, 6))
@SETTINGS
def test_causal_queries_are_the_last_positions(n_q, extra):
    n_k = n_q + extra
    m = masks.causal(n_q, n_k)
    assert m.shape == (n_q, n_k)
    for i in range(n_q):
        pos = n_k - n_q + i  # absolute position of query i
        for j in range(n_k):
            assert bool(m[i, j]) == (j <= pos)
    # The last query sees every key; the mask equals the last n_q rows of the square causal mask.
    assert bool(m[-1].all())
    assert torch.equal(m, masks.causal(n_k)[-n_q:])


def test_causal_single_query_over_cache_sees_everything():
    assert torch.equal(masks.causal(1, 6), torch.ones(1, 6, dtype=torch.bool))


def test_causal_broadcasts_to_bhqk():
    m = masks.causal(3, 5)
    assert torch.broadcast_shapes(m.shape, (2, 4, 3, 5)) == (2, 4, 3, 5)
    masks.check_mask(m, (2, 4, 3, 5))


# ---- valid lengths ---------------------------------------------------------------------------------


def test_valid_lengths_per_sequence():
    lengths = torch.tensor([0, 2, 4])
    m = masks.valid_lengths(lengths, 4)
    assert m.dtype == torch.bool and m.shape == (3, 1, 1, 4)
    expected = torch.tensor(
        [[False, False, False, False], [True, True, False, False], [True, True, True, True]]
    )
    assert torch.equal(m[:, 0, 0], expected)
    full = _full(m, (3, 2, 5, 4))
    assert torch.equal(full, expected[:, None, None, :].expand(3, 2, 5, 4))


@given(
    B=st.integers(1, 3),
    Nq=st.integers(1, 4),
    Nk=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_valid_lengths_per_query(B, Nq, Nk, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, Nk + 1, (B, Nq), generator=g)
    m = masks.valid_lengths(lengths, Nk)
    assert m.shape == (B, 1, Nq, Nk)
    for b in range(B):
        for i in range(Nq):
            for j in range(Nk):
                assert bool(m[b, 0, i, j]) == (j < int(lengths[b, i]))
    masks.check_mask(m, (B, 3, Nq, Nk))


def test_valid_lengths_accepts_lists_of_ints():
    assert torch.equal(masks.valid_lengths([1, 3], 3)[:, 0, 0], torch.tensor([[1, 0, 0], [1, 1, 1]]).bool())


@pytest.mark.parametrize(
    "lengths",
    [torch.tensor([1.0, 2.0]), torch.tensor([True, False]), torch.tensor(3), torch.zeros(2, 2, 2, dtype=torch.long)],
    ids=["float", "bool", "scalar", "3d"],
)
def test_valid_lengths_rejects_bad_lengths(lengths):
    with pytest.raises(ValueError, match="lengths"):
        masks.valid_lengths(lengths, 4)


# ---- padding ---------------------------------------------------------------------------------------


def test_padding_masks_pad_keys_for_every_query():
    is_pad = torch.tensor([[False, False, True], [False, True, True]])
    m = masks.padding(is_pad)
    assert m.shape == (2, 1, 1, 3)
    assert torch.equal(m[:, 0, 0], ~is_pad)
    full = _full(m, (2, 4, 5, 3))
    assert torch.equal(full[1, 2, 4], torch.tensor([True, False, False]))


def test_padding_equals_valid_lengths_for_right_padding():
    lengths = torch.tensor([3, 1, 0])
    is_pad = torch.arange(4)[None, :] >= lengths[:, None]
    assert torch.equal(masks.padding(is_pad), masks.valid_lengths(lengths, 4))


@pytest.mark.parametrize(
    "is_pad",
    [torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, dtype=torch.bool), torch.zeros(1, 2, 3, dtype=torch.bool)],
    ids=["int", "1d", "3d"],
)
def test_padding_rejects_bad_input(is_pad):
    with pytest.raises(ValueError, match="is_pad"):
        masks.padding(is_pad)


# ---- prefix ----------------------------------------------------------------------------------------


@given(n_prefix=st.integers(0, 5), n=st.integers(1, 8), extra=st.integers(0, 4))
@SETTINGS
def test_prefix_definition(n_prefix, n, extra):
    n_q, n_k = n, n + extra
    m = masks.prefix(n_prefix, n_q, n_k)
    assert m.shape == (n_q, n_k) and m.dtype == torch.bool
    for i in range(n_q):
        pos = n_k - n_q + i
        for j in range(n_k):
            if pos < n_prefix:
                # A prefix token attends to the whole prefix and never to text.
                expected = j < n_prefix
            else:
                # A text token attends to every earlier token, the whole prefix included.
                expected = j <= pos
            assert bool(m[i, j]) == expected, (i, j, pos)


def test_prefix_example():
    m = masks.prefix(2, 4)
    expected = torch.tensor(
        [
            [1, 1, 0, 0],  # prefix tokens see each other (also "the future" inside the prefix) ...
            [1, 1, 0, 0],  # ... but never the text
            [1, 1, 1, 0],  # text is causal and sees the whole prefix
            [1, 1, 1, 1],
        ]
    ).bool()
    assert torch.equal(m, expected)


def test_prefix_extremes():
    assert torch.equal(masks.prefix(0, 5), masks.causal(5))  # no prefix: causal
    assert bool(masks.prefix(5, 5).all())  # all prefix: bidirectional
    assert bool(masks.prefix(9, 3, 6).all())  # a prefix longer than the sequence is still all-visible


# ---- adjacency -------------------------------------------------------------------------------------


def test_adjacency_2d_with_and_without_self_loops():
    adj = torch.tensor([[0, 1, 0], [0, 0, 0], [1, 1, 0]])
    m = masks.adjacency(adj)
    assert m.shape == (3, 3) and m.dtype == torch.bool
    assert torch.equal(m, (adj != 0) | torch.eye(3, dtype=torch.bool))
    m0 = masks.adjacency(adj, self_loops=False)
    assert torch.equal(m0, adj != 0)
    assert not bool(m0[1].any())  # an isolated node without self loop attends to nothing


def test_adjacency_is_directed_row_attends_to_column():
    adj = torch.zeros(3, 3)
    adj[0, 2] = 1.0  # edge 0 -> 2: node 0 attends to node 2
    m = masks.adjacency(adj, self_loops=False)
    assert bool(m[0, 2]) and not bool(m[2, 0])


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.float32])
def test_adjacency_batched(dtype):
    g = torch.Generator().manual_seed(0)
    adj = (torch.rand(2, 4, 4, generator=g) > 0.5).to(dtype)
    m = masks.adjacency(adj, self_loops=True)
    assert m.shape == (2, 1, 4, 4)
    eye = torch.eye(4, dtype=torch.bool)
    for b in range(2):
        assert torch.equal(m[b, 0], (adj[b] != 0) | eye)
    masks.check_mask(m, (2, 3, 4, 4))


def test_adjacency_float_weights_are_edges():
    adj = torch.tensor([[0.0, 0.3], [-2.0, 0.0]])
    assert torch.equal(masks.adjacency(adj, self_loops=False), torch.tensor([[False, True], [True, False]]))


@pytest.mark.parametrize(
    "adj", [torch.zeros(3, 4), torch.zeros(2, 3, 4), torch.zeros(5), torch.zeros(1, 2, 3, 3)],
    ids=["2d-rect", "3d-rect", "1d", "4d"],
)
def test_adjacency_rejects_non_square(adj):
    with pytest.raises(ValueError, match="square"):
        masks.adjacency(adj)


# ---- combination and broadcasting -----------------------------------------------------------------


def test_combination_with_and():
    lengths = torch.tensor([2, 4])
    m = masks.causal(4) & masks.valid_lengths(lengths, 4)
    assert m.shape == (2, 1, 4, 4)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                assert bool(m[b, 0, i, j]) == (j <= i and j < int(lengths[b]))


def test_combination_prefix_padding_adjacency():
    is_pad = torch.tensor([[False, False, False, True]])
    m = masks.prefix(2, 4) & masks.padding(is_pad)
    assert m.shape == (1, 1, 4, 4)
    assert not bool(m[..., 3].any())  # the pad column is never attended to
    adj = torch.ones(1, 4, 4, dtype=torch.bool)
    both = m & masks.adjacency(adj)
    assert torch.equal(both, m)


@pytest.mark.parametrize(
    "make",
    [
        lambda: masks.causal(3, 5),
        lambda: masks.prefix(2, 3, 5),
        lambda: masks.valid_lengths(torch.tensor([1, 5]), 5),
        lambda: masks.valid_lengths(torch.tensor([[1, 2, 3], [5, 0, 4]]), 5),
        lambda: masks.padding(torch.zeros(2, 5, dtype=torch.bool)),
        lambda: masks.causal(3, 5) & masks.valid_lengths(torch.tensor([1, 5]), 5),
    ],
    ids=["causal", "prefix", "lengths", "lengths-per-query", "padding", "combined"],
)
def test_every_mask_broadcasts_to_bhqk(make):
    m = make()
    assert m.dtype == torch.bool
    assert torch.broadcast_shapes(m.shape, (2, 4, 3, 5)) == (2, 4, 3, 5)
    masks.check_mask(m, (2, 4, 3, 5))


def test_adjacency_broadcasts_to_bhqk():
    masks.check_mask(masks.adjacency(torch.ones(4, 4)), (2, 3, 4, 4))
    masks.check_mask(masks.adjacency(torch.ones(2, 4, 4)), (2, 3, 4, 4))


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: masks.causal(5, 3), "n_k"),
        (lambda: masks.causal(0), "positive"),
        (lambda: masks.prefix(1, 5, 3), "n_k"),
        (lambda: masks.prefix(-1, 3), "n_prefix"),
        (lambda: masks.prefix(1, 0), "positive"),
    ],
    ids=["causal-nk<nq", "causal-zero", "prefix-nk<nq", "prefix-negative", "prefix-zero"],
)
def test_size_errors_have_a_message(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_check_mask_errors():
    with pytest.raises(ValueError, match="boolean"):
        masks.check_mask(torch.ones(3, 3), (1, 1, 3, 3))
    with pytest.raises(ValueError, match="broadcast"):
        masks.check_mask(torch.ones(3, 4, dtype=torch.bool), (1, 1, 3, 3))
    with pytest.raises(ValueError, match="broadcast"):
        # Broadcasts *up* to a larger shape, which is not (B, H, Nq, Nk) either.
        masks.check_mask(torch.ones(2, 1, 1, 3, dtype=torch.bool), (1, 1, 3, 3))
    with pytest.raises(ValueError, match="at most 4"):
        masks.check_mask(torch.ones(1, 1, 1, 3, 3, dtype=torch.bool), (1, 1, 3, 3))
