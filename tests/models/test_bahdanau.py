"""The GRU + additive attention baseline: attention weights, padding, cached vs uncached decoding."""

import pytest
import torch
from support import assert_cached_decoding_agrees, assert_steps_match_teacher_forcing, random_model

from tokennet.models.bahdanau import BahdanauConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(**kw):
    return random_model("bahdanau-micro", std=0.5, matrices_only=False, **kw)


def test_forward_backward():
    m = _model(num_layers=2)
    x, y = m.example_input(3), m.example_targets(3)
    out = m(x, y)
    assert out.logits.shape == (3, x[1].shape[1], m.config.vocab_size)
    out.loss.backward()
    assert m.score.W_q.weight.grad is not None


def test_attention_rows_sum_to_one_and_skip_padding():
    m = _model()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 0, 0, 0]])
    tgt = torch.tensor([[1, 7, 8], [1, 9, 10]])
    a = m.attention_maps((src, tgt))["cross"][0][:, 0]  # (B, T, S)
    assert a.shape == (2, 3, 5)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 3))
    assert (a[1, :, 2:] == 0).all()


def test_padding_does_not_change_the_output():
    m = _model()
    tgt = torch.tensor([[1, 7, 8]])
    a = m((torch.tensor([[5, 6, 7]]), tgt)).logits
    b = m((torch.tensor([[5, 6, 7, 0, 0, 0]]), tgt)).logits
    torch.testing.assert_close(a, b)


def test_empty_source_row_gives_finite_outputs():
    m = _model()
    out = m((torch.tensor([[5, 6], [0, 0]]), torch.tensor([[1, 4], [1, 4]]))).logits
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("num_layers", [1, 2])
def test_cached_and_uncached_decoding_agree(num_layers):
    m = _model(num_layers=num_layers)
    src, _ = m.example_input(4)
    greedy = assert_cached_decoding_agrees(m, src)
    assert len(set(greedy.flatten().tolist())) > 2


def test_step_logits_match_teacher_forcing():
    m = _model()
    src, _ = m.example_input(2)
    assert_steps_match_teacher_forcing(m, src, torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]]))


def test_config_validation_and_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        BahdanauConfig(dim=33)
    m = _model()
    with pytest.raises(ValueError, match="maximum"):
        m((torch.full((1, 40), 5), torch.tensor([[1]])))
    with pytest.raises(ValueError, match="empty"):
        m((torch.zeros(1, 0, dtype=torch.long), torch.tensor([[1]])))
