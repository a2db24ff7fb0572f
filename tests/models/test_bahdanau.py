"""The GRU + additive attention baseline: attention weights, padding, cached vs uncached decoding."""

import pytest
import torch

from tokennet.decode import beam_search, greedy_search
from tokennet.models import create_model
from tokennet.models.bahdanau import BahdanauConfig


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is as fast, and far faster when other processes share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model(**kw):
    torch.manual_seed(0)
    m = create_model("bahdanau-micro", **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.5)  # varied random outputs for the decoding tests
    return m


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
    g1 = greedy_search(m, src, use_cache=True)
    assert torch.equal(g1, greedy_search(m, src, use_cache=False))
    assert len(set(g1.flatten().tolist())) > 2
    b1 = beam_search(m, src, beam_size=3, use_cache=True)
    assert torch.equal(b1, beam_search(m, src, beam_size=3, use_cache=False))
    assert torch.equal(beam_search(m, src, beam_size=1), g1)


def test_step_logits_match_teacher_forcing():
    m = _model()
    src, _ = m.example_input(2)
    tgt = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    full = m((src, tgt)).logits
    state = m.init_decode(src)
    steps = torch.cat([m.decode_step(tgt[:, t : t + 1], state) for t in range(4)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_config_validation_and_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        BahdanauConfig(dim=33)
    m = _model()
    with pytest.raises(ValueError, match="maximum"):
        m((torch.full((1, 40), 5), torch.tensor([[1]])))
    with pytest.raises(ValueError, match="empty"):
        m((torch.zeros(1, 0, dtype=torch.long), torch.tensor([[1]])))
