"""Swin's relative position bias: one learned value per head and 2-D offset, the same wherever the pair sits."""

import itertools

import pytest
import torch

from tokennet.position.relative_bias import RelativePositionBias2D, relative_position_index


@pytest.mark.parametrize("window", [(3, 3), (2, 5), (1, 4)])
def test_the_bias_is_translation_invariant_within_a_window(window):
    torch.manual_seed(0)
    rpb = RelativePositionBias2D(window, num_heads=3)
    b = rpb()  # (H, N, N)
    wh, ww = window
    N = wh * ww
    assert b.shape == (3, N, N)
    pos = [(i // ww, i % ww) for i in range(N)]
    by_offset: dict[tuple[int, int], torch.Tensor] = {}
    for i, j in itertools.product(range(N), repeat=2):
        off = (pos[j][0] - pos[i][0], pos[j][1] - pos[i][1])
        if off in by_offset:  # every pair at this offset, wherever it sits, reads the same bias
            torch.testing.assert_close(b[:, i, j], by_offset[off], rtol=0, atol=0)
        by_offset[off] = b[:, i, j]
    assert len(by_offset) == (2 * wh - 1) * (2 * ww - 1)  # and different offsets read different table rows
    assert len({tuple(v.tolist()) for v in by_offset.values()}) == len(by_offset)


def test_the_index_follows_swins_formula_and_is_not_saved():
    idx = relative_position_index((2, 3))
    # pair (token 0 at (0, 0), token 5 at (1, 2)): offset (1, 2) → (1 + 1)·5 + (2 + 2) = 14
    assert int(idx[0, 5]) == 14 and int(idx[5, 0]) == 0 and int(idx[2, 2]) == (2 - 1) * 5 + (3 - 1)
    assert list(RelativePositionBias2D((2, 3), 2).state_dict()) == ["table"]


def test_the_bias_is_learned():
    rpb = RelativePositionBias2D((2, 2), 2)
    rpb().sum().backward()
    assert rpb.table.grad is not None and bool((rpb.table.grad != 0).any())
