"""GPT options for faster training: ReLU² MLP and QK-norm (shapes, causality, the formula)."""

import torch

from tokennet.attention.multihead import MultiHeadAttention
from tokennet.layers.mlp import MLP, ReLU2
from tokennet.models import create_model


def test_relu2_is_squared_relu():
    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(ReLU2()(x), torch.clamp(x, min=0) ** 2)
    mlp = MLP(8, activation="relu2")
    assert mlp(torch.randn(2, 5, 8)).shape == (2, 5, 8)


def test_qk_norm_attention_matches_the_plain_formula():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, qk_norm=True, bias=False)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 6, 16)
    B, N, H, E = 2, 6, 4, 4
    q, k, v = attn.qkv_proj(x).split(16, -1)
    q, k, v = (t.view(B, N, H, E).transpose(1, 2) for t in (q, k, v))  # (B, H, N, E)

    def rms(t, g):
        return t / t.pow(2).mean(-1, keepdim=True).add(torch.finfo(t.dtype).eps).sqrt() * g

    q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    s = q @ k.transpose(-1, -2) / E**0.5
    s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    ref = attn.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, 16))
    torch.testing.assert_close(attn(x, is_causal=True), ref, atol=1e-5, rtol=1e-4)
    plain = MultiHeadAttention(16, 4, bias=False)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "norm" not in k})
    assert not torch.allclose(plain(x, is_causal=True), ref, atol=1e-3)  # the option changes the output


def test_gpt_with_relu2_and_qk_norm_is_causal_and_trains():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=17, block_size=16, activation="relu2", qk_norm=True)
    assert m.decoder.blocks[0].attn.q_norm is not None
    x = m.example_input(2)
    out = m(x, m.example_targets(2))
    assert out.logits.shape == (2, 16, 17)
    out.loss.backward()
    assert m.decoder.blocks[0].attn.q_norm.weight.grad is not None
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 17  # change the future only
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits[:, :10], m(x2).logits[:, :10])


def test_cached_decoding_with_qk_norm_matches_full_forward():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=17, block_size=16, qk_norm=True, position="rope").eval()
    x = m.example_input(1)[:, :8]
    with torch.no_grad():
        full = m(x).logits
        caches = m.make_caches()
        steps = [m(x[:, :5], caches=caches).logits] + [m(x[:, i:i + 1], caches=caches).logits for i in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)


def test_defaults_unchanged():
    m = create_model("gpt-micro", vocab_size=17)
    assert m.decoder.blocks[0].attn.q_norm is None
    assert not any("q_norm" in n for n, _ in m.named_parameters())
