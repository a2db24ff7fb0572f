"""Window attention (Swin): the windowed reshape against full attention under the equivalent mask, the shifted
windows against the mask built on the rolled grid (Swin's own construction), padding, maps, and the cost."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tokennet.attention.multihead import MultiHeadAttention
from tokennet.attention.windows import (
    WindowAttention,
    msa_macs,
    window_layout,
    window_msa_macs,
    window_partition,
    window_reverse,
)
from tokennet.position.relative_bias import relative_position_index


def _swin_region_labels(Hp: int, Wp: int, window: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """Swin's own boundary-mask construction (microsoft/Swin-Transformer, SwinTransformerBlock): label the
    rolled grid with 3 × 3 slices; tokens of a window may attend to each other iff their labels agree."""
    img = torch.zeros(Hp, Wp)
    (wh, ww), (sh, sw) = window, shift
    hs = (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)) if sh else (slice(0, None),)
    ws = (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)) if sw else (slice(0, None),)
    cnt = 0
    for h in hs:
        for w in ws:
            img[h, w] = cnt
            cnt += 1
    return img


def _reference(attn: WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """Full multi-head attention over the padded, rolled grid with the mask built on that grid: same window,
    same Swin region, key not padding; the relative bias of the pair's offset; then roll back and crop."""
    B, H, W, D = x.shape
    lay = attn.layout((H, W))
    (wh, ww), (sh, sw), (Hp, Wp) = lay.window, lay.shift, lay.padded
    xp = torch.nn.functional.pad(x, (0, 0, 0, Wp - W, 0, Hp - H)).roll((-sh, -sw), dims=(1, 2))
    rho, gam = torch.meshgrid(torch.arange(Hp), torch.arange(Wp), indexing="ij")
    rho, gam = rho.flatten(), gam.flatten()  # rolled coordinates of every position
    win = (rho // wh) * (Wp // ww) + gam // ww
    region = _swin_region_labels(Hp, Wp, (wh, ww), (sh, sw)).flatten()
    real = ((rho + sh) % Hp < H) & ((gam + sw) % Wp < W)
    mask = (win[:, None] == win[None]) & (region[:, None] == region[None]) & real[None]  # (L, L)
    mh, mw = attn.window_size  # the table covers the offsets of the configured M × M window (⊇ the layout's)
    dr = (rho[None] - rho[:, None]).clamp(-(mh - 1), mh - 1) + mh - 1
    dc = (gam[None] - gam[:, None]).clamp(-(mw - 1), mw - 1) + mw - 1
    table = attn.rel_bias.table  # ((2·mh − 1)(2·mw − 1), H)
    bias = table[dr * (2 * mw - 1) + dc].permute(2, 0, 1)  # (H, L, L); out-of-window pairs are masked anyway
    # the parent class's forward: plain multi-head attention with the same projections
    out = MultiHeadAttention.forward(attn, xp.reshape(B, Hp * Wp, D), mask=mask, bias=bias)
    out = out.view(B, Hp, Wp, D).roll((sh, sw), dims=(1, 2))
    return out[:, :H, :W]


@pytest.mark.parametrize("grid,window,shifted", [((8, 8), 4, False), ((8, 8), 4, True), ((6, 9), 3, True),
                                                 ((6, 6), 4, False), ((6, 6), 4, True), ((1, 12), 4, True),
                                                 ((4, 4), 7, True)])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_window_attention_equals_full_attention_under_the_window_mask(grid, window, shifted, backend):
    torch.manual_seed(0)
    attn = WindowAttention(16, 2, window, shifted=shifted, backend=backend).eval()
    with torch.no_grad():
        attn.rel_bias.table.normal_()  # a bias large enough to matter
    x = torch.randn(2, *grid, 16)
    torch.testing.assert_close(attn(x), _reference(attn, x), atol=1e-5, rtol=1e-5)


def _window_of(lay, token: int) -> int:
    return int((lay.token_index() == token).any(1).nonzero()[0])


def test_shifted_windows_straddle_the_borders_and_the_wrap_is_masked():
    lay, shifted = window_layout((8, 8), 4), window_layout((8, 8), 4, shifted=True)
    assert lay.shift == (0, 0) and lay.mask() is None and shifted.shift == (2, 2)
    # tokens 3 and 4 of row 0 sit on either side of a window border; the shifted windows put them together
    assert _window_of(lay, 3) != _window_of(lay, 4)
    assert _window_of(shifted, 3 + 8 * 3) == _window_of(shifted, 4 + 8 * 3)
    # after the roll, row 0 lands next to row 7 in one window, but they are no neighbours: masked both ways
    w = _window_of(shifted, 0)
    assert w == _window_of(shifted, 7 * 8)
    idx, m = shifted.token_index()[w], shifted.mask()[w]
    i, j = int((idx == 0).nonzero()), int((idx == 56).nonzero())
    assert not bool(m[i, j]) and not bool(m[j, i]) and bool(m[i, i]) and bool(m[j, j])


@pytest.mark.parametrize("grid,window,shifted", [((8, 8), 4, True), ((6, 9), 3, True), ((6, 6), 4, True)])
def test_groups_are_the_full_attention_mask(grid, window, shifted):
    torch.manual_seed(0)
    attn = WindowAttention(8, 2, window, shifted=shifted).eval()
    x = torch.randn(1, *grid, 8)
    _, a = attn(x, return_weights=True)
    g = attn.layout(grid).groups()
    torch.testing.assert_close(a[0, 0] > 0, g[:, None] == g[None])  # softmax weights are positive inside


def test_a_grid_no_larger_than_the_window_is_one_unshifted_window():
    lay = window_layout((4, 4), 7, shifted=True)
    assert lay.window == (4, 4) and lay.shift == (0, 0) and lay.num_windows == 1 and lay.mask() is None
    assert window_layout((1, 40), 8, shifted=True).shift == (0, 4)  # 1-D: shifted along its length only


def test_partition_and_reverse_are_inverse_reshapes():
    x = torch.arange(2 * 6 * 8 * 3, dtype=torch.float32).view(2, 6, 8, 3)
    w = window_partition(x, (3, 4))
    assert w.shape == (2 * 4, 12, 3)
    torch.testing.assert_close(w[0].view(3, 4, 3), x[0, :3, :4])  # the first window is the top-left block
    torch.testing.assert_close(w[1].view(3, 4, 3), x[0, :3, 4:])  # then the one to its right
    torch.testing.assert_close(window_reverse(w, (3, 4), (6, 8)), x)


@pytest.mark.parametrize("shifted", [False, True])
def test_returned_weights_are_the_attention_on_the_whole_grid(shifted):
    torch.manual_seed(1)
    attn = WindowAttention(8, 2, 3, shifted=shifted).eval()
    x = torch.randn(1, 6, 7, 8)
    out, a = attn(x, return_weights=True)
    torch.testing.assert_close(out, attn(x))
    L = 42
    assert a.shape == (1, 2, L, L)
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 2, L))  # every real query's row sums to 1
    lay = attn.layout((6, 7))
    idx = lay.token_index()
    same = torch.zeros(L, L, dtype=torch.bool)
    for w in range(lay.num_windows):
        real = idx[w][idx[w] >= 0]
        same[real[:, None], real[None]] = True
    assert bool((a[0, :, ~same] == 0).all())  # no weight outside the token's window


def test_window_attention_shares_the_multihead_parameter_names():
    names = set(dict(WindowAttention(8, 2, 4).named_parameters()))
    assert {"qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias", "rel_bias.table"} == names


# -- cost ------------------------------------------------------------------------------------------------
def _counted_macs(module, x) -> int:
    with FlopCounterMode(display=False) as fc:
        module(x)
    return fc.get_total_flops() // 2  # the counter counts 2 FLOPs per multiply-add


@pytest.mark.parametrize("side", [4, 8])
def test_the_analytic_counts_are_what_the_modules_compute(side):
    D, M = 16, 4
    glob = MultiHeadAttention(D, 2, backend="math").eval()
    win = WindowAttention(D, 2, M, backend="math").eval()
    N = side * side
    with torch.no_grad():
        assert _counted_macs(glob, torch.randn(1, N, D)) == msa_macs(N, D)
        assert _counted_macs(win, torch.randn(1, side, side, D)) == window_msa_macs(N, M * M, D)


def test_global_attention_is_quadratic_and_window_attention_linear_in_the_tokens():
    C, M2 = 96, 49

    def slope(f, n1, n2):
        return math.log(f(n2) / f(n1)) / math.log(n2 / n1)

    glob = slope(lambda n: msa_macs(n, C), 1024, 4096)
    win = slope(lambda n: window_msa_macs(n, M2, C), 1024, 4096)
    assert 1.8 < glob < 2.0 and win == pytest.approx(1.0, abs=1e-12)
    # far from the projections' share, global attention's order tends to 2
    assert slope(lambda n: msa_macs(n, C), 2**16, 2**18) > 1.99
    assert window_msa_macs(4096, M2, C) < msa_macs(4096, C) / 10


def test_relative_index_is_one_row_per_offset():
    idx = relative_position_index((3, 4))
    assert idx.shape == (12, 12) and int(idx.max()) == 5 * 7 - 1 and len(idx.unique()) == 5 * 7
