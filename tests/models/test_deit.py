"""DeiT (distill=True): a distillation token beside the class token, its own head, the ½ + ½ loss against
the labels and the teacher's hard labels, the averaged heads at test time; stochastic depth in ViT."""

import pytest
import torch
import torch.nn.functional as F

from tokennet.layers.drop_path import DropPath
from tokennet.models import create_model, load_pretrained, save_pretrained


def test_the_distillation_token_follows_the_class_token():
    m = create_model("deit-micro").eval()
    c = m.config
    assert c.num_prefix == 2 and c.dist_index == 1
    x = m.example_input(3)
    h = m.forward_features(x)
    assert h.shape == (3, 2 + 16, 32)
    cls, dist = m.forward_heads(h)
    torch.testing.assert_close(cls, m.head(h[:, 0]))
    torch.testing.assert_close(dist, m.head_dist(h[:, 1]))
    torch.testing.assert_close(m(x).logits, (cls + dist) / 2)  # the heads are averaged at test time
    assert m.attention_maps(x)["self"][0].shape == (3, 2, 18, 18)


def test_the_loss_is_half_labels_half_teacher():
    torch.manual_seed(0)
    m = create_model("deit-micro", label_smoothing=0.1).eval()
    x, y = m.example_input(4), torch.tensor([0, 1, 2, 3])
    t = torch.tensor([3, 3, 3, 3])
    cls, dist = m.forward_heads(m.forward_features(x))
    want = 0.5 * F.cross_entropy(cls, y, label_smoothing=0.1) + 0.5 * F.cross_entropy(dist, t)
    torch.testing.assert_close(m(x, (y, t)).loss, want)
    alone = 0.5 * F.cross_entropy(cls, y, label_smoothing=0.1) + 0.5 * F.cross_entropy(dist, y, label_smoothing=0.1)
    torch.testing.assert_close(m(x, y).loss, alone)  # no teacher: both heads learn the labels
    soft = F.one_hot(y, 10).float()
    assert torch.isfinite(m(x, (soft, t)).loss)  # mixed labels with the teacher's hard ones
    with pytest.raises(ValueError, match="distillation token"):
        create_model("vit-micro")(x, (y, t))


def test_a_mean_pooled_deit_averages_only_the_patches():
    m = create_model("deit-micro", pool="mean").eval()
    assert m.config.num_prefix == 1 and m.config.dist_index == 0
    h = m.forward_features(m.example_input(2))
    torch.testing.assert_close(m.pool(h), h[:, 1:].mean(1))


def test_deit_saves_and_loads(tmp_path):
    m = create_model("deit-micro").eval()
    save_pretrained(m, tmp_path)
    n = load_pretrained(tmp_path).eval()
    x = m.example_input(2)
    torch.testing.assert_close(n(x).logits, m(x).logits)


def test_stochastic_depth_drops_residual_branches_of_the_vit_blocks():
    m = create_model("vit-micro", drop_path=0.2, num_layers=3)
    rates = [blk.drop[1].p if isinstance(blk.drop, torch.nn.Sequential) else 0.0 for blk in m.encoder.layers()]
    assert rates == pytest.approx([0.0, 0.1, 0.2])
    assert isinstance(m.encoder.layers()[2].drop[1], DropPath)
    x = m.example_input(8)
    m.train()
    torch.manual_seed(0)
    a = m(x).logits
    torch.manual_seed(1)
    assert not torch.allclose(a, m(x).logits)  # different branches dropped
    m.eval()
    torch.testing.assert_close(m(x).logits, m(x).logits)
    # a block's branches go through its `drop` module: with every branch dropped, a block is the identity
    blk = m.encoder.layers()[2]
    blk.drop[1].p = 0.999999
    blk.train()
    z = torch.randn(4, 5, 32)
    torch.manual_seed(0)
    torch.testing.assert_close(blk(z), z)
