"""``position_mode="concat"``: positions concatenated to the tokens instead of added."""

import pytest
import torch

from tokennet.position.concat import ConcatPosition, with_position_mode
from tokennet.position.learned import LearnedPosition
from tokennet.position.sinusoidal import SinusoidalPosition


@torch.no_grad()
def test_concat_keeps_the_content_and_appends_the_table():
    torch.manual_seed(0)
    enc = LearnedPosition(10, 4)
    cat = with_position_mode(enc, "concat", 4)
    x = torch.randn(2, 6, 5)
    y = cat(x, offset=3)
    assert y.shape == (2, 6, 9)
    assert torch.equal(y[..., :5], x)  # the content untouched: no dimension is shared
    assert torch.equal(y[0, :, 5:], enc.weight[3:9]) and torch.equal(y[1, :, 5:], enc.weight[3:9])
    assert with_position_mode(enc, "add", 4) is enc


@torch.no_grad()
def test_concat_of_sinusoidal_positions_and_bad_modes():
    s = SinusoidalPosition(6, max_len=20)
    y = ConcatPosition(s, 6)(torch.zeros(1, 4, 2))
    assert torch.allclose(y[0, :, 2:], s(torch.zeros(1, 4, 6))[0])
    with pytest.raises(ValueError, match="position_mode"):
        with_position_mode(s, "multiply", 6)
    with pytest.raises(ValueError, match="pos_dim"):
        ConcatPosition(s, 0)


@torch.no_grad()
def test_concatenated_positions_break_permutation_equivariance():
    torch.manual_seed(0)
    cat = ConcatPosition(LearnedPosition(5, 3, init_std=1.0), 3)
    x = torch.randn(1, 5, 2)
    perm = torch.tensor([4, 0, 3, 1, 2])
    assert not torch.allclose(cat(x[:, perm]), cat(x)[:, perm])  # each token now carries where it came from
    assert torch.allclose(cat(x[:, perm])[..., :2], cat(x)[:, perm][..., :2])
