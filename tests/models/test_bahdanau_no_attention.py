"""The GRU encoder–decoder without attention (``attention=False``): one fixed summary c = [h→_S; h←_1]."""

import pytest
import torch
from support import assert_cached_decoding_agrees, assert_steps_match_teacher_forcing, random_model

from tokennet.errors import ConfigError
from tokennet.models.bahdanau import BahdanauConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(**kw):
    return random_model("bahdanau-micro", std=0.5, matrices_only=False, attention=False, **kw)


def test_no_score_parameters_and_the_rest_unchanged():
    with_att = random_model("bahdanau-micro", std=0.5, matrices_only=False)
    without = _model()
    assert without.score is None
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(with_att) - n(without) == sum(p.numel() for p in with_att.score.parameters()) > 0


def test_the_context_is_the_two_final_states():
    m = _model(num_layers=2).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    memory, mask, s0 = m.encode(src)
    assert memory.shape == (2, 1, m.config.dim) and mask.shape == (2, 1, 1) and bool(mask.all())
    # run the top layer's two directions by hand on the unpadded second source
    emb = m.tok_emb(src[1:, :3])
    out, _ = m.encoder(emb)  # (1, 3, D): [h→_j; h←_j]
    half = m.config.dim // 2
    expect = torch.cat([out[0, -1, :half], out[0, 0, half:]])  # h→_S (last step), h←_1 (first step)
    torch.testing.assert_close(memory[1, 0], expect)


def test_padding_and_decoding_agree():
    m = _model()
    tgt = torch.tensor([[1, 7, 8]])
    a = m((torch.tensor([[5, 6, 7]]), tgt)).logits
    b = m((torch.tensor([[5, 6, 7, 0, 0, 0]]), tgt)).logits
    torch.testing.assert_close(a, b)
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    assert_steps_match_teacher_forcing(m, src, torch.tensor([[1, 7, 8, 9], [1, 9, 10, 11]]))
    assert_cached_decoding_agrees(m, src)


def test_trains_and_refuses_attention_maps():
    m = _model()
    x, y = m.example_input(3), m.example_targets(3)
    m(x, y).loss.backward()
    assert m.encoder.weight_ih_l0.grad is not None and m.init_proj.weight.grad is not None
    with pytest.raises(ConfigError, match="no attention"):
        m.attention_maps(x)
    with pytest.raises(ConfigError, match="attention"):
        BahdanauConfig(attention="yes")
