"""Greedy and beam search over the conditional decoding protocol, on a model whose probabilities we know."""

import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from tokennet.decode import beam_search, greedy_search, length_penalty, strip_special

pytestmark = pytest.mark.usefixtures("one_thread")


PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4


@dataclass
class _Cfg:
    max_target_len: int = 8
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS


@dataclass
class _State:
    rows: torch.Tensor  # (B,) which input each row belongs to
    prefix: torch.Tensor  # (B, t) tokens seen so far (the "cache")
    use_cache: bool

    @property
    def batch_size(self):
        return self.rows.shape[0]

    def reorder(self, index):
        self.rows = self.rows.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)


class TrapModel(nn.Module):
    """After <bos>: A with p=0.6, B with p=0.4. After A: EOS with p=0.3, else 7 filler tokens with 0.1 each.
    After B: EOS with p=0.95. Greedy picks A then EOS (0.18); the best sequence is B EOS (0.38)."""

    def __init__(self):
        super().__init__()
        self.config = _Cfg()
        self.dummy = nn.Parameter(torch.zeros(1))
        V = 12
        t = torch.full((V, V), 1e-9)
        t[BOS, A], t[BOS, B] = 0.6, 0.4
        t[A, EOS] = 0.3
        t[A, 5:12] = 0.1
        t[B, EOS], t[B, A] = 0.95, 0.05
        for tok in range(5, V):
            t[tok, EOS] = 1.0
        t[EOS, EOS] = 1.0
        t[PAD, PAD] = 1.0
        self.logp = (t / t.sum(-1, keepdim=True)).log()

    def init_decode(self, x, *, use_cache=True):
        return _State(torch.arange(x.shape[0]), torch.zeros(x.shape[0], 0, dtype=torch.long), use_cache)

    def decode_step(self, tokens, state):
        if state.use_cache:
            state.prefix = torch.cat([state.prefix, tokens], dim=1)
            full = state.prefix
        else:
            full = tokens
        return self.logp[full]  # (B, t, V): the next-token log-probs after each token


def test_greedy_falls_into_the_trap_and_beam_escapes_it():
    m = TrapModel()
    x = torch.zeros(2, 1)
    g = greedy_search(m, x)
    assert strip_special(g) == [[A], [A]]
    for use_cache in (True, False):
        b, score = beam_search(m, x, beam_size=2, alpha=0.0, use_cache=use_cache, return_scores=True)
        assert strip_special(b) == [[B], [B]]
        torch.testing.assert_close(score, torch.full((2,), math.log(0.4 * 0.95)))


def test_beam_of_one_is_greedy():
    m = TrapModel()
    x = torch.zeros(3, 1)
    assert torch.equal(beam_search(m, x, beam_size=1), greedy_search(m, x))


def test_length_penalty_and_its_effect():
    assert length_penalty(torch.tensor([1]), 0.0).item() == 1.0
    torch.testing.assert_close(length_penalty(torch.tensor([7]), 1.0), torch.tensor([2.0]))
    # With α = 0 hypotheses are ranked by log-probability alone: "B <eos>" (0.38) wins.
    m = TrapModel()
    x = torch.zeros(1, 1)
    assert strip_special(beam_search(m, x, beam_size=3, alpha=0.0)) == [[B]]


def test_strip_special():
    ids = torch.tensor([[5, 6, EOS, PAD], [7, PAD, PAD, PAD], [8, 9, 10, 11]])
    assert strip_special(ids) == [[5, 6], [7], [8, 9, 10, 11]]


def test_bad_arguments():
    m = TrapModel()
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(m, x, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(m, x, alpha=-1)
    with pytest.raises(ValueError, match="exceeds"):
        greedy_search(m, x, max_len=50)
    with pytest.raises(ValueError, match="not a conditional decoder"):
        greedy_search(nn.Linear(2, 2), x)
