"""Swin's layers: patch merging halves the grid and doubles the width; stochastic depth; the Swin block."""

import pytest
import torch

from tokennet.layers.drop_path import DropPath, drop_path_rates
from tokennet.layers.windowed import PatchMerging, SwinBlock


def test_patch_merging_halves_the_grid_and_doubles_the_width():
    torch.manual_seed(0)
    pm = PatchMerging(8)
    x = torch.randn(2, 6, 4, 8)
    y = pm(x)
    assert y.shape == (2, 3, 2, 16)
    # the concatenation is Swin's: x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]
    ref = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    torch.testing.assert_close(y, pm.reduction(pm.norm(ref)))


def test_patch_merging_pads_an_odd_grid_and_merges_pairs_of_a_1d_grid():
    assert PatchMerging(4)(torch.randn(1, 7, 7, 4)).shape == (1, 4, 4, 8)
    one_d = PatchMerging(4, factor=(1, 2))
    x = torch.randn(1, 1, 6, 4)
    y = one_d(x)
    assert y.shape == (1, 1, 3, 8)
    torch.testing.assert_close(y, one_d.reduction(one_d.norm(torch.cat([x[:, :, 0::2], x[:, :, 1::2]], -1))))


def test_drop_path_drops_whole_samples_and_keeps_the_mean():
    torch.manual_seed(0)
    dp = DropPath(0.25)
    x = torch.ones(4000, 3, 5)
    y = dp(x)
    per_sample = y.flatten(1)
    assert bool(((per_sample == 0).all(1) | (per_sample == 1 / 0.75).all(1)).all())  # all or nothing
    assert float((per_sample[:, 0] == 0).float().mean()) == pytest.approx(0.25, abs=0.03)
    assert float(y.mean()) == pytest.approx(1.0, abs=0.05)
    assert torch.equal(dp.eval()(x), x)
    assert drop_path_rates(0.2, 5) == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2]) and drop_path_rates(0.3, 1) == [0.0]
    with pytest.raises(ValueError):
        DropPath(1.0)


def test_swin_block_keeps_the_grid_and_returns_its_windows_attention():
    torch.manual_seed(0)
    blk = SwinBlock(16, 2, 4, shifted=True).eval()
    x = torch.randn(2, 8, 8, 16)
    y, w = blk(x, return_weights=True)
    assert y.shape == x.shape and w["self"].shape == (2, 2, 64, 64)
    torch.testing.assert_close(y, blk(x))
    # the block's parts carry the names every transformer block uses
    assert set(dict(blk.named_children())) == {"norm1", "attn", "norm2", "mlp", "drop_path"}
