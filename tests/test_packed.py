"""The float32 decoding copy: linear layers packed as column blocks of Wᵀ, same numbers, never stale."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tokennet.layers.quantize import PackedLinear, decoding_copy
from tokennet.models import create_model
from tokennet.sampling import generate

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(1,), (5,), (2, 7)])
def test_packed_linear_equals_f_linear(parts, bias, lead):
    torch.manual_seed(0)
    lin = nn.Linear(40, 301, bias=bias)  # 301 = 7·43: P = 2, 3, 4 leave a zero-padded last block
    p = PackedLinear(lin, parts=parts)
    assert p.parts == parts and p.blocks.shape == (parts, 40, -(-301 // parts))
    assert torch.equal(p.weight_t(), lin.weight.detach().T)  # the blocks hold Wᵀ exactly
    x = torch.randn(*lead, 40)
    y = p(x)
    assert y.shape == (*lead, 301)
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)


def test_parts_never_exceed_the_rows():
    lin = nn.Linear(16, 100)
    assert PackedLinear(lin, parts=8).parts == 1  # 100 rows < 2 · 64: one block
    assert PackedLinear(nn.Linear(16, 256), parts=8).parts == 4


def test_decoding_copy_packs_every_linear_and_leaves_the_model_alone():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=48, block_size=16).train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    d = decoding_copy(m)
    assert d is not m and not d.training and m.training
    linears = [n for n, mod in m.named_modules() if type(mod) is nn.Linear]
    dmods = dict(d.named_modules())
    assert linears and all(isinstance(dmods[n], PackedLinear) for n in linears)  # the LM head too
    assert all(type(dict(m.named_modules())[n]) is nn.Linear for n in linears)
    assert d.tok_emb.weight is m.tok_emb.weight  # everything but the linear weights is shared, not copied
    assert m.lm_head.weight is m.tok_emb.weight  # the model's head is still tied
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    x = m.example_input(3)
    with torch.no_grad():
        torch.testing.assert_close(d(x).logits, m.eval()(x).logits, rtol=1e-5, atol=1e-5)


def test_decoding_copy_is_reused_until_a_parameter_changes():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=32, block_size=16)
    d1 = decoding_copy(m)
    assert decoding_copy(m) is d1  # nothing changed: the packed copy is reused
    x = m.example_input(2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(x, m.example_targets(2)).loss.backward()
    opt.step()  # in place: the version counters move
    d2 = decoding_copy(m)
    assert d2 is not d1
    with torch.no_grad():
        torch.testing.assert_close(d2(x).logits, m.eval()(x).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(d1(x).logits, d2(x).logits)  # the old copy was stale indeed
    m.load_state_dict(create_model("gpt-micro", vocab_size=32, block_size=16).state_dict())
    d3 = decoding_copy(m)
    assert d3 is not d2
    with torch.no_grad():
        torch.testing.assert_close(d3(x).logits, m(x).logits, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        m.decoder.norm.weight.mul_(2.0)  # an in-place edit of a non-linear parameter counts too
    assert decoding_copy(m) is not d3


def test_other_precisions_and_quantized_modes_are_not_packed():
    m = create_model("gpt-micro", vocab_size=32, block_size=16)
    assert decoding_copy(m.to(torch.float64)) is m
    assert not any(isinstance(x, PackedLinear) for x in decoding_copy(m.float(), "int8").modules())


def test_generate_with_the_packed_copy_matches_the_plain_model():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=40, block_size=16, num_kv_heads=2).eval()
    prompt = torch.randint(40, (2, 4))
    out = generate(m, prompt, 24, temperature=0)  # past the context: the cache is rebuilt
    # The same greedy loop on the unpacked model, written out: the packed copy changes no decision.
    seq = prompt
    with torch.no_grad():
        while seq.shape[1] < 16:  # within the context, where cached and uncached decoding agree
            nxt = m(seq).logits[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
    assert torch.equal(out[:, :16], seq)
