import math

import pytest
import torch
import torch.nn.functional as F

from tokennet.models import create_model, list_models, load_pretrained, save_pretrained
from tokennet.models.registry import preset_info
from tokennet.models.vit import ViT, ViTConfig

VIT_PRESETS = [n for n in list_models() if preset_info(n)[0] == "vit"]


def micro(**kw):
    torch.manual_seed(0)
    return create_model("vit-micro", **kw).eval()


@pytest.mark.parametrize("name", VIT_PRESETS)
def test_every_preset_builds_and_trains_one_step(name):
    torch.manual_seed(0)
    m = create_model(name, dim=32, num_layers=1, num_heads=2)
    x, y = m.example_input(2), m.example_targets(2)
    out = m(x, y)
    assert out.logits.shape == (2, m.config.num_classes)
    out.loss.backward()
    assert all(p.grad is not None for p in m.patch_embed.parameters())


def test_presets_have_the_documented_shapes():
    assert create_model("vit").config.grid == (14, 14)  # ViT-Ti/16: 196 patches
    assert create_model("vit-digits").config.grid == (3, 3)  # overlapping 4×4 patches at stride 2
    assert create_model("vit-fashion").config.grid == (4, 4)  # conv stem, total stride 8
    one_d = create_model("vit-1d").config
    assert one_d.is_1d and one_d.grid == (1, 17)  # patches of 8 at stride 2


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("position", ["learned", "fourier", "none"])
def test_forward_shapes_and_loss(pool, position):
    m = micro(pool=pool, position=position)
    x, y = m.example_input(3), m.example_targets(3)
    h = m.forward_features(x)
    assert h.shape == (3, 16 + (pool == "cls"), 32)
    out = m(x, y)
    assert out.logits.shape == (3, 10)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, y))


def test_label_smoothing_in_the_loss():
    m = micro(label_smoothing=0.1)
    x, y = m.example_input(4), m.example_targets(4)
    out = m(x, y)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, y, label_smoothing=0.1))


def test_conv_and_linear_patch_embedding_give_the_same_logits():
    a = micro(patch_embed="conv")
    b = micro(patch_embed="linear")
    b.load_state_dict(a.state_dict())
    x = a.example_input(2)
    torch.testing.assert_close(a(x).logits, b(x).logits, rtol=1e-5, atol=1e-5)


def test_without_positions_mean_pooling_is_invariant_to_patch_order():
    """Attention and the MLP are permutation equivariant; mean pooling makes the output invariant."""
    m = micro(position="none", pool="mean")
    x = m.example_input(1)  # (1, 3, 16, 16): a 4×4 grid of 4×4 patches
    blocks = x.reshape(1, 3, 4, 4, 4, 4).permute(0, 1, 2, 4, 3, 5).reshape(1, 3, 16, 4, 4)  # (1, C, N, 4, 4)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    y = blocks[:, :, perm].reshape(1, 3, 4, 4, 4, 4).permute(0, 1, 2, 4, 3, 5).reshape(1, 3, 16, 16)
    torch.testing.assert_close(m(x).logits, m(y).logits, rtol=1e-4, atol=1e-5)
    with_pos = micro(pool="mean")
    with torch.no_grad():
        with_pos.pos_emb.weight.normal_()  # positions large enough to matter
    assert not torch.allclose(with_pos(x).logits, with_pos(y).logits, atol=1e-4)


@pytest.mark.parametrize("position", ["learned", "fourier"])
def test_other_image_sizes_use_interpolated_positions(position):
    m = micro(position=position)
    x = torch.rand(2, 3, 24, 32)  # grid 6 × 8 instead of 4 × 4
    assert m.forward_features(x).shape == (2, 1 + 48, 32)
    assert m.position_table((6, 8)).shape == (48, 32)
    torch.testing.assert_close(m.position_table(), m.position_table((4, 4)))


def test_bad_inputs_say_what_is_expected():
    m = micro()
    with pytest.raises(ValueError, match=r"expects 3 channel\(s\).*got shape \(2, 1, 16, 16\)"):
        m(torch.rand(2, 1, 16, 16))
    with pytest.raises(ValueError, match="size 15x16 does not fit.*image_size=16"):
        m(torch.rand(2, 3, 15, 16))
    with pytest.raises(ValueError, match=r"expects images of shape \(B, 3, 16, 16\)"):
        m(torch.rand(3, 16, 16))
    fixed = micro(position="none")
    with pytest.raises(ValueError, match="no positions to resize"):
        fixed(torch.rand(1, 3, 24, 24))


def test_config_validation():
    with pytest.raises(ValueError, match="must divide dim"):
        ViTConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="divisible by 4"):
        ViTConfig(dim=30, num_heads=3, position="fourier")
    with pytest.raises(ValueError, match="pool must be one of"):
        ViTConfig(pool="max")
    with pytest.raises(ValueError, match="width 30 is not covered.*pad=True"):
        ViTConfig(image_size=[28, 30], patch_size=4)
    assert ViTConfig(image_size=[28, 30], patch_size=4, pad=True).grid == (7, 8)
    with pytest.raises(ValueError, match="1-D model"):
        ViTConfig(image_size=[40], patch_size=[2, 2])


def test_1d_model_takes_signals():
    torch.manual_seed(0)
    m = create_model("vit-1d", dim=32, num_layers=1, num_heads=2).eval()
    s = torch.randn(3, 40)
    torch.testing.assert_close(m(s).logits, m(s[:, None]).logits)
    assert m(torch.randn(2, 1, 48)).logits.shape == (2, 10)  # longer signal: positions interpolated
    with pytest.raises(ValueError, match=r"\(B, 1, L\)"):
        m(torch.randn(2, 1, 8, 5))
    with pytest.raises(ValueError, match="size 41 does not fit"):
        m(torch.randn(2, 1, 41))


def test_1d_and_overlapping_configs_survive_save_load(tmp_path):
    torch.manual_seed(0)
    m = create_model("vit-1d", dim=32, num_layers=1, num_heads=2, patch_size=8, patch_stride=4).eval()
    assert m.config.grid == (1, 9)
    save_pretrained(m, tmp_path)
    n = load_pretrained(tmp_path).eval()
    assert n.config == m.config and n.config.image_size == [40]
    x = m.example_input(2)
    torch.testing.assert_close(n(x).logits, m(x).logits)


def _manual_attention(m: ViT, x, layer):
    """Attention of ``layer`` by hand: run the blocks before it, then softmax(Q Kᵀ / √E) of its input."""
    c = m.config
    z = m.patch_embed(x)
    z = torch.cat([m.cls_token.expand(len(x), 1, -1), z], 1) if m.cls_token is not None else z
    z = m.pos_emb(z)
    blocks = m.encoder.layers()
    for blk in blocks[:layer]:
        z = blk(z)
    attn = blocks[layer].attn
    h = blocks[layer].norm1(z)
    B, N, _ = h.shape
    E = c.dim // c.num_heads
    W_q, W_k, _ = attn.qkv_proj.weight.split(c.dim)  # [W_q; W_k; W_v]
    b_q, b_k, _ = attn.qkv_proj.bias.split(c.dim)
    q = (h @ W_q.T + b_q).view(B, N, c.num_heads, E).transpose(1, 2)  # (B, H, N, E)
    k = (h @ W_k.T + b_k).view(B, N, c.num_heads, E).transpose(1, 2)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(E), dim=-1)


@pytest.mark.parametrize("backend", ["sdpa", "flash", "auto"])
def test_attention_maps_of_a_fused_backend_model_match_the_formula(backend):
    m = micro(backend=backend, num_layers=3)
    x = m.example_input(2)
    before = m(x).logits
    maps = m.attention_maps(x)
    assert list(maps) == ["self"]
    maps = maps["self"]
    assert len(maps) == 3 and maps[0].shape == (2, 2, 17, 17)
    for i, a in enumerate(maps):
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 17))
        torch.testing.assert_close(a, _manual_attention(m, x, i), rtol=1e-5, atol=1e-6)
    # inspection leaves the model as it was: same backend, nothing stored on the modules
    assert all(b.attn.backend == backend for b in m.encoder.layers())
    torch.testing.assert_close(m(x).logits, before)


def test_patch_dropout_keeps_a_random_subset_in_training_only():
    m = micro(patch_dropout=0.5, pool="cls")
    x = m.example_input(2)
    assert m.forward_features(x).shape == (2, 17, 32)  # eval: every patch
    m.train()
    torch.manual_seed(0)
    h = m.forward_features(x)
    assert h.shape == (2, 1 + 8, 32)
    m(x, m.example_targets(2)).loss.backward()
    with pytest.raises(ValueError, match="patch_dropout"):
        ViTConfig(patch_dropout=1.0)


def test_conv_stem_variant():
    m = micro(patch_embed="conv-stem", patch_size=4)
    assert m.config.grid == (4, 4)
    x = m.example_input(2)
    assert m.forward_features(x).shape == (2, 17, 32)
    assert len(m.attention_maps(x)["self"]) == 2
    with pytest.raises(ValueError, match="power of two"):
        ViTConfig(image_size=28, patch_size=7, patch_embed="conv-stem")
    with pytest.raises(ValueError, match="2-D images"):
        ViTConfig(image_size=[40], patch_size=4, patch_embed="conv-stem")


def test_a_hard_coded_patch_projection_is_saved_with_the_model_and_refused_with_a_conv_stem(tmp_path):
    """The lecture's W_tokenize "could be a learned matrix, or it could be somehow hard-coded"."""
    m = micro(patch_projection="random")
    assert "patch_embed.weight" not in dict(m.named_parameters())
    save_pretrained(m, tmp_path)
    torch.manual_seed(1)  # another seed would draw another matrix: the loaded one must be the saved one
    n = load_pretrained(tmp_path).eval()
    # exact by contract: loading copies the saved bytes (a redrawn matrix would differ everywhere)
    assert n.config.patch_projection == "random" and torch.equal(n.patch_embed.weight, m.patch_embed.weight)
    x = m.example_input(2)
    torch.testing.assert_close(n(x).logits, m(x).logits)
    with pytest.raises(ValueError, match="patch_projection must be one of"):
        ViTConfig(patch_projection="fourier")
    with pytest.raises(ValueError, match="a conv stem has none"):
        ViTConfig(image_size=28, patch_size=8, patch_embed="conv-stem", patch_projection="dct")
