"""The Swin family: the stage layout (grids halve, widths and heads double), 1-D signals, config errors."""

import pytest
import torch

from tokennet.errors import ConfigError, DataError
from tokennet.models import create_model


def test_stages_halve_the_grid_and_double_width_and_heads():
    m = create_model("swin-t", dim=16, num_heads=2, num_classes=5).eval()
    c = m.config
    assert c.stage_grids() == [(56, 56), (28, 28), (14, 14), (7, 7)]
    assert c.stage_dims() == [16, 32, 64, 128] and c.stage_heads() == [2, 4, 8, 16] and c.num_layers == 12
    h = m.forward_features(m.example_input(1))
    assert h.shape == (1, 49, 128) and m(m.example_input(1)).logits.shape == (1, 5)
    shifts = [b["layout"].shift for b in m.block_layouts()]
    assert shifts[:2] == [(0, 0), (3, 3)] and shifts[-1] == (0, 0)  # 7 × 7 at the last stage: one window


def test_a_small_image_makes_a_global_last_stage_and_odd_grids_round_up():
    m = create_model("swin-micro", image_size=28, patch_size=2, in_channels=1, depths=[2, 2, 2], window_size=7)
    assert m.config.stage_grids() == [(14, 14), (7, 7), (4, 4)]
    maps = m.attention_maps(torch.rand(2, 1, 28, 28))["self"]
    assert [a.shape[-1] for a in maps] == [196, 196, 49, 49, 16, 16]
    torch.testing.assert_close(maps[2].sum(-1), torch.ones(2, 4, 49))


def test_a_1d_swin_classifies_signals():
    m = create_model("swin-micro", image_size=[40], patch_size=2, in_channels=1, window_size=8, depths=[2, 2])
    assert m.config.stage_grids() == [(1, 20), (1, 10)]
    assert m(torch.randn(3, 1, 40)).logits.shape == (3, 10) and m(torch.randn(3, 40)).logits.shape == (3, 10)
    with pytest.raises(ValueError, match="1-D Swin expects signals"):
        m(torch.randn(3, 1, 8, 5))


def test_drop_path_grows_with_depth_and_only_in_training():
    m = create_model("swin-micro", drop_path=0.3)
    rates = [getattr(b.drop_path, "p", 0.0) for s in m.stages for b in s.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    x = m.example_input(2)
    m.eval()
    torch.testing.assert_close(m(x).logits, m(x).logits)


@pytest.mark.parametrize("over,match", [({"depths": []}, "depths"), ({"depths": [2, 0]}, "depths"),
                                        ({"num_heads": 3}, "must divide"), ({"drop_path": 1.0}, "drop_path"),
                                        ({"patch_size": 5}, "not covered"), ({"stem_width": 8}, "conv-stem")])
def test_config_errors_say_what_to_fix(over, match):
    with pytest.raises(ConfigError, match=match):
        create_model("swin-micro", **over)


def test_an_image_the_patches_do_not_tile_is_a_data_error_unless_padded():
    m = create_model("swin-micro")
    with pytest.raises(DataError, match="does not fit"):
        m(torch.rand(1, 3, 15, 16))
    padded = create_model("swin-micro", image_size=15, pad=True)
    assert padded.config.grid == (8, 8) and padded(torch.rand(1, 3, 15, 15)).logits.shape == (1, 10)
