"""Llama's options of the shared layers: RMSNorm, the gated (SwiGLU) MLP, and a GPT built with them."""

import torch
import torch.nn.functional as F

from tokennet.layers.block import Block, make_norm
from tokennet.layers.mlp import MLP, GatedMLP
from tokennet.layers.norm import Norm
from tokennet.models import create_model


def test_rmsnorm_formula_and_no_bias():
    norm = make_norm("rmsnorm", 6, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6))
    x = torch.randn(2, 3, 6)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    assert torch.allclose(norm(x), want, atol=1e-6)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_swiglu_formula():
    torch.manual_seed(0)
    mlp = GatedMLP(8, 12, activation="silu", bias=False)
    x = torch.randn(2, 5, 8)
    want = (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.fc1.weight.T)) @ mlp.fc2.weight.T
    assert torch.allclose(mlp(x), want, atol=1e-6)
    assert [n for n, _ in mlp.named_parameters()] == ["fc1.weight", "gate.weight", "fc2.weight"]  # saved order
    assert not hasattr(MLP(8, 12), "gate")  # the plain MLP is unchanged


def test_block_with_llama_options_has_no_layernorm_or_bias():
    blk = Block(16, 2, norm_layer="rmsnorm", gated_mlp=True, activation="silu", bias=False)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in blk.modules())
    assert not any(n.endswith("bias") for n, _ in blk.named_parameters())
    # the same block from composed parts: a norm kind and an MLP kind
    parts = Block(16, 2, norm_layer=Norm("rmsnorm", eps=1e-5), bias=False,
                  mlp=lambda d: GatedMLP(d, mlp_ratio=4.0, activation="silu", bias=False))
    assert [n for n, _ in parts.named_parameters()] == [n for n, _ in blk.named_parameters()]
    parts.load_state_dict(blk.state_dict())
    x = torch.randn(2, 3, 16)
    assert torch.equal(parts.eval()(x), blk.eval()(x))


def test_llama_shaped_gpt_cached_decoding_equals_full_pass():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=50, position="rope", rope_base=1e5, norm_layer="rmsnorm",
                     gated_mlp=True, activation="silu", bias=False, num_kv_heads=2, tie_weights=False).eval()
    ids = torch.randint(50, (2, 10))
    full = m(ids).logits
    caches = m.make_caches()
    steps = [m(ids[:, :4], caches=caches).logits] + [m(ids[:, i:i + 1], caches=caches).logits for i in range(4, 10)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
