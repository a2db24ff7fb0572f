import pytest
import torch

from tokennet.tokens.image import PatchEmbed, grid_size, patch_padding, patchify


def test_224_image_with_16_patches_is_196_tokens():
    x = torch.randn(2, 3, 224, 224)
    p = patchify(x, 16)
    assert p.shape == (2, 196, 3 * 16 * 16)
    assert grid_size(224, 16) == (14, 14)
    assert PatchEmbed(3, 192, 16)(x).shape == (2, 196, 192)


def test_patch_layout_is_row_major_channel_major():
    x = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(1, 2, 4, 6)  # C=2, H=4, W=6
    p = patchify(x, 2)  # grid 2 × 3
    assert p.shape == (1, 6, 8)
    # patch 4 sits at grid row 1, column 1: rows 2..3, columns 2..3 of each channel, channel 0 first
    expected = torch.cat([x[0, c, 2:4, 2:4].reshape(-1) for c in range(2)])
    torch.testing.assert_close(p[0, 4], expected)


def test_rectangular_patches_and_overlap():
    x = torch.randn(1, 1, 8, 12)
    assert patchify(x, (4, 3)).shape == (1, 2 * 4, 12)
    # overlapping: patch 4, stride 2 on 8×12 → grid 3 × 5
    p = patchify(x, 4, stride=2)
    assert p.shape == (1, 15, 16) and grid_size((8, 12), 4, 2) == (3, 5)
    torch.testing.assert_close(p[0, 1], x[0, 0, 0:4, 2:6].reshape(-1))


def test_non_dividing_size_errors_or_pads():
    x = torch.randn(1, 3, 30, 32)
    with pytest.raises(ValueError, match="height 30 is not covered by patches of 4.*pad=True"):
        patchify(x, 4)
    p = patchify(x, 4, pad=True)  # 30 → 32: one zero row on each side
    assert p.shape == (1, 64, 48)
    assert patch_padding(30, 4, 4) == 2 and patch_padding(32, 4, 4) == 0
    assert p[0, 0].reshape(3, 4, 4)[:, 0].abs().sum() == 0  # the top padding row
    with pytest.raises(ValueError, match="smaller than the patch"):
        patchify(torch.randn(1, 1, 3, 8), 4)
    with pytest.raises(ValueError, match="(B, C, H, W)"):
        patchify(torch.randn(8, 8), 4)


def test_1d_signals_cut_into_1d_patches():
    s = torch.arange(2 * 1 * 12, dtype=torch.float32).reshape(2, 1, 12)
    p = patchify(s, 4)
    assert p.shape == (2, 3, 4)
    torch.testing.assert_close(p[1, 2], s[1, 0, 8:12])
    assert patchify(s, 4, stride=2).shape == (2, 5, 4)


@pytest.mark.parametrize("patch, stride, size", [(4, None, (8, 12)), (3, 1, (7, 7)), ((2, 4), (2, 2), (6, 8))])
def test_conv_and_linear_modes_agree(patch, stride, size):
    torch.manual_seed(0)
    conv = PatchEmbed(3, 16, patch, stride, mode="conv")
    lin = PatchEmbed(3, 16, patch, stride, mode="linear")
    lin.load_state_dict(conv.state_dict())  # the same weights
    x = torch.randn(2, 3, *size)
    torch.testing.assert_close(conv(x), lin(x), rtol=1e-5, atol=1e-5)
    # and both equal the lecture's formula T = patchify(x) E + b
    ref = patchify(x, patch, stride) @ conv.weight.flatten(1).t() + conv.bias
    torch.testing.assert_close(conv(x), ref, rtol=1e-5, atol=1e-5)


def test_padded_embed_modes_agree():
    torch.manual_seed(0)
    conv = PatchEmbed(1, 8, 4, pad=True)
    lin = PatchEmbed(1, 8, 4, pad=True, mode="linear")
    lin.load_state_dict(conv.state_dict())
    x = torch.randn(2, 1, 10, 13)
    assert conv.grid((10, 13)) == (3, 4)
    torch.testing.assert_close(conv(x), lin(x), rtol=1e-5, atol=1e-5)


def test_patch_embed_bad_input():
    pe = PatchEmbed(1, 8, 4)
    with pytest.raises(ValueError, match="expected images with 1 channel"):
        pe(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="width 10 is not covered"):
        pe(torch.randn(2, 1, 8, 10))
    with pytest.raises(ValueError, match="floating point"):
        pe(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="mode"):
        PatchEmbed(1, 8, 4, mode="mlp")
    with pytest.raises(ValueError, match="patch_size"):
        PatchEmbed(1, 8, 0)


def test_conv_stem_tokens_cover_p_by_p_cells():
    from tokennet.tokens.image import ConvStem

    stem = ConvStem(1, 32, 4)
    assert len([m for m in stem.stem if isinstance(m, torch.nn.Conv2d)]) == 3  # two stride-2 3×3, one 1×1
    assert stem(torch.randn(2, 1, 28, 28)).shape == (2, 49, 32)
    assert stem.grid((30, 28)) == (8, 7) and stem(torch.randn(1, 1, 30, 28)).shape == (1, 56, 32)
    with pytest.raises(ValueError, match="power of two"):
        ConvStem(1, 32, 6)
    with pytest.raises(ValueError, match="expected images with 1 channel"):
        stem(torch.randn(1, 3, 28, 28))


# -- W_tokenize learned or hard-coded (issue 62 item 6) -------------------------------------------------------------


def test_the_dct_basis_is_orthonormal_per_channel_with_the_constant_first():
    from tokennet.tokens.image import dct_basis

    basis = dct_basis(2, (4, 4))  # (C·ph·pw, C, ph, pw)
    flat = basis.flatten(1)
    torch.testing.assert_close(flat @ flat.T, torch.eye(32), atol=1e-5, rtol=0)
    torch.testing.assert_close(basis[0, 0], torch.full((4, 4), 0.25))  # channel 0's mean, then channel 1's
    torch.testing.assert_close(basis[1, 1], torch.full((4, 4), 0.25))
    assert basis[0, 1].abs().sum() == 0 and basis[1, 0].abs().sum() == 0  # each row reads one channel


def test_a_fixed_projection_is_a_saved_buffer_that_training_never_changes():
    from tokennet.tokens.image import dct_basis

    for projection in ("random", "dct"):
        embed = PatchEmbed(1, 24, 4, projection=projection)
        assert [name for name, _ in embed.named_parameters()] == ["bias"] and "weight" in embed.state_dict()
        before = embed.weight.clone()
        embed(torch.randn(2, 1, 8, 8)).square().sum().backward()
        assert embed.bias.grad is not None and torch.equal(embed.weight, before)
    cut = PatchEmbed(1, 8, 4, projection="dct").weight  # D = 8 < 16 frequencies: the 8 lowest
    padded = PatchEmbed(1, 24, 4, projection="dct").weight  # D = 24 > 16: zero rows after the 16
    torch.testing.assert_close(cut, dct_basis(1, (4, 4))[:8])
    assert padded[16:].abs().sum() == 0 and torch.equal(padded[:8], cut)
    assert [name for name, _ in PatchEmbed(1, 24, 4).named_parameters()] == ["weight", "bias"]  # learned


def test_the_random_projection_follows_the_seed_and_has_unit_gain():
    torch.manual_seed(0)
    first = PatchEmbed(3, 256, 4, projection="random").weight
    torch.manual_seed(0)
    assert torch.equal(first, PatchEmbed(3, 256, 4, projection="random").weight)
    assert abs(float(first.flatten(1).square().sum(1).mean()) - 1) < 0.1  # E‖row‖² = fan_in · 1/fan_in


def test_an_unknown_projection_is_refused():
    from tokennet.errors import ConfigError

    with pytest.raises(ConfigError, match="patch_projection must be one of learned, random, dct, got 'fourier'"):
        PatchEmbed(1, 8, 4, projection="fourier")
