import pytest
import torch

from tokennet.models import create_model
from tokennet.models.gpt import GPTConfig


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi"])
def test_incremental_logits_equal_full_pass(position):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=30, block_size=20, position=position).eval()
    idx = torch.randint(30, (2, 12))
    with torch.no_grad():
        full = m(idx).logits
        caches = m.make_caches()
        parts = [m(idx[:, :5], caches=caches).logits]
        parts += [m(idx[:, t : t + 1], caches=caches).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_causal_lm_logits_do_not_see_the_future():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=30).eval()
    a = torch.randint(30, (1, 10))
    b = a.clone()
    b[0, 6:] = (b[0, 6:] + 1) % 30
    with torch.no_grad():
        torch.testing.assert_close(m(a).logits[:, :6], m(b).logits[:, :6])


def test_tied_weights_and_loss_at_init():
    m = create_model("gpt-micro", vocab_size=50)
    assert m.lm_head.weight is m.tok_emb.weight
    idx, tgt = torch.randint(50, (4, 16)), torch.randint(50, (4, 16))
    loss = m(idx, tgt).loss
    # At init the prediction is nearly uniform: loss ≈ ln V.
    assert abs(loss.item() - torch.log(torch.tensor(50.0)).item()) < 0.3


def test_ignore_index_and_too_long():
    m = create_model("gpt-micro", vocab_size=50, block_size=8)
    idx = torch.randint(50, (1, 8))
    t = idx.clone()
    t[:, :4] = -100
    assert torch.isfinite(m(idx, t).loss)
    with pytest.raises(ValueError, match="exceeds block_size"):
        m(torch.randint(50, (1, 9)))


def test_token_mixer_variant_trains():
    m = create_model("gpt-micro", vocab_size=20, mixer="token", block_size=8)
    idx = torch.randint(20, (2, 8))
    m(idx, idx).loss.backward()
    assert m.decoder.blocks[0].attn.W.grad is not None


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"dim": 30, "num_heads": 4}, "must divide dim"),
        ({"position": "nope"}, "position must be one of"),
        ({"num_layers": 0}, "num_layers must be a positive"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GPTConfig(**{"dim": 32, "num_heads": 4, **kw})


def test_norm_free_gpt_has_no_norm_and_still_decodes_incrementally():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=30, block_size=20, norm_placement="none").eval()
    assert not any(isinstance(x, (torch.nn.LayerNorm, torch.nn.RMSNorm)) for x in m.modules())
    idx = torch.randint(30, (2, 12))
    with torch.no_grad():
        full = m(idx).logits
        caches = m.make_caches()
        parts = [m(idx[:, :5], caches=caches).logits] + [m(idx[:, t:t + 1], caches=caches).logits
                                                         for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="norm_placement must be one of"):
        GPTConfig(dim=32, num_heads=4, norm_placement="post")


def test_gqa_model_runs():
    m = create_model("gpt-micro", vocab_size=20, num_heads=4, num_kv_heads=2)
    assert m.decoder.blocks[0].attn.qkv_proj.out_features == 4 * 16 + 2 * (2 * 16)  # H·E + 2·Hkv·E
    idx = torch.randint(20, (2, 8))
    m(idx, idx).loss.backward()
