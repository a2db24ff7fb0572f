import pytest
import torch
import torch.nn.functional as F

from tokennet.position import LearnedPosition, LearnedPosition2D


def test_adds_slice_with_offset():
    torch.manual_seed(0)
    pos = LearnedPosition(10, 4)
    assert pos.weight.shape == (10, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(pos(x), x + pos.weight[:3])
    torch.testing.assert_close(pos(x, offset=7), x + pos.weight[7:10])


def test_error_past_max_len():
    pos = LearnedPosition(10, 4)
    with pytest.raises(ValueError, match="max_len=10"):
        pos(torch.zeros(1, 11, 4))
    with pytest.raises(ValueError, match="max_len=10"):
        pos(torch.zeros(1, 3, 4), offset=8)


@pytest.mark.parametrize("new_len", [5, 40])
def test_resize_interpolates_and_keeps_endpoints(new_len):
    pos = LearnedPosition(20, 3)
    t = torch.linspace(0, 1, 20)
    with torch.no_grad():  # a smooth table: ramp, constant, sine
        pos.weight.copy_(torch.stack([t, torch.ones(20), torch.sin(3 * t)], dim=1))
    old = pos.weight.detach().clone()
    assert pos.resize(new_len) is pos
    assert pos.weight.shape == (new_len, 3) and pos.max_len == new_len
    assert isinstance(pos.weight, torch.nn.Parameter) and pos.weight.requires_grad
    w = pos.weight.detach()
    torch.testing.assert_close(w[:, 1], torch.ones(new_len))
    # align_corners=False samples cell centres: endpoints move by at most half a new cell (in old
    # positions, (20/new_len − 1)/2 steps of 1/19), times the table's largest slope (3 for sin 3t)
    tol = 3 * max(0.0, (20 / new_len - 1) / 2) / 19 + 1e-6
    assert torch.allclose(w[0], old[0], atol=tol) and torch.allclose(w[-1], old[-1], atol=tol)
    ref = F.interpolate(old.t()[None], size=new_len, mode="linear", align_corners=False)[0].t()
    torch.testing.assert_close(w, ref)
    assert pos(torch.zeros(1, new_len, 3)).shape == (1, new_len, 3)


def test_2d_same_grid_is_identity_and_prefix_kept():
    torch.manual_seed(0)
    pos = LearnedPosition2D((3, 4), 8, num_prefix=1)
    assert pos.weight.shape == (1 + 12, 8)
    torch.testing.assert_close(pos.interpolate((3, 4)), pos.weight)
    x = torch.randn(2, 13, 8)
    torch.testing.assert_close(pos(x), x + pos.weight)
    table = pos.interpolate((6, 5))
    assert table.shape == (1 + 30, 8)
    torch.testing.assert_close(table[0], pos.weight[0])  # <cls> row is not interpolated
    assert pos(torch.zeros(2, 31, 8), grid=(6, 5)).shape == (2, 31, 8)


def test_2d_bicubic_matches_direct_resampling():
    torch.manual_seed(0)
    pos = LearnedPosition2D((4, 4), 2)
    img = pos.weight.detach().reshape(4, 4, 2).permute(2, 0, 1)[None]  # (1, D, gh, gw)
    for grid in [(8, 6), (2, 3)]:
        ref = F.interpolate(img, size=grid, mode="bicubic", align_corners=False, antialias=True)
        ref = ref[0].permute(1, 2, 0).reshape(-1, 2)
        torch.testing.assert_close(pos.interpolate(grid), ref)
    with torch.no_grad():
        pos.weight.fill_(0.5)  # a constant field stays constant
    torch.testing.assert_close(pos.interpolate((7, 9)), torch.full((63, 2), 0.5))


def test_2d_gradients_flow_through_interpolation():
    pos = LearnedPosition2D((2, 2), 4)
    pos(torch.zeros(1, 9, 4), grid=(3, 3)).sum().backward()
    assert pos.weight.grad is not None and pos.weight.grad.abs().sum() > 0


def test_2d_bad_input():
    pos = LearnedPosition2D((3, 4), 8, num_prefix=1)
    with pytest.raises(ValueError, match="grid"):
        pos(torch.zeros(2, 12, 8))
    with pytest.raises(ValueError, match="grid"):
        LearnedPosition2D((3, 0), 8)
