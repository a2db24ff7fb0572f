import pytest
import torch

from tokennet.models import create_model
from tokennet.sampling import generate, sample_next, stream


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("gpt-micro", vocab_size=40, block_size=16).eval()


def test_cached_and_uncached_give_same_tokens_and_logits(model):
    prompt = torch.randint(40, (2, 4))
    a = generate(model, prompt, 12, temperature=0, use_cache=True)
    b = generate(model, prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(a, b)
    # Logits at each step, cached vs a full recomputation.
    with torch.no_grad():
        caches = model.make_caches()
        model(a[:, :4], caches=caches)
        for t in range(4, a.shape[1] - 1):
            step = model(a[:, t : t + 1], caches=caches).logits[:, -1]
            full = model(a[:, : t + 1]).logits[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_sliding_window_past_context(model):
    prompt = torch.randint(40, (1, 10))
    out = generate(model, prompt, 30, temperature=0)  # 40 tokens > block_size 16
    assert out.shape == (1, 40)
    out2 = generate(model, prompt, 30, temperature=0, use_cache=False)
    assert out2.shape == (1, 40)
    assert torch.equal(out[:, :16], out2[:, :16])  # identical while inside the context


def test_sampling_is_reproducible_and_respects_top_k():
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, -2.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    s = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(s.tolist()) <= {2, 3}
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(sample_next(logits, generator=g1), sample_next(logits, generator=g2))


def test_top_p_keeps_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().repeat(400, 1)
    s = sample_next(logits, top_p=0.75, generator=torch.Generator().manual_seed(0))
    assert set(s.tolist()) == {0, 1}  # 0.5 < 0.75 ≤ 0.8: the first two
    s = sample_next(logits, top_p=0.01, generator=torch.Generator().manual_seed(0))
    assert set(s.tolist()) == {0}


def test_greedy_is_argmax():
    logits = torch.randn(3, 10)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))


def test_stop_tokens_and_streaming(model):
    prompt = torch.randint(40, (1, 3))
    greedy = generate(model, prompt, 10, temperature=0)
    stop_tok = int(greedy[0, 5])
    out = generate(model, prompt, 10, temperature=0, stop=stop_tok)
    assert int(out[0, -1]) == stop_tok and out.shape[1] <= greedy.shape[1]
    seen = []
    generate(model, prompt, 5, temperature=0, callback=lambda t: seen.append(int(t[0])))
    assert seen == greedy[0, 3:8].tolist()
    assert len(list(stream(model, prompt, 4, temperature=0))) == 4


@pytest.mark.parametrize(
    "kw, msg",
    [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature"),
     ({"top_p": 1.5}, "top_p"), ({"top_k": 0}, "top_k")],
)
def test_bad_arguments(model, kw, msg):
    args = {"max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=msg):
        generate(model, torch.zeros(1, 1, dtype=torch.long), **args)


@pytest.mark.parametrize("temperature", [1e-40, 1e-6])
def test_a_temperature_below_the_epsilon_is_greedy(model, temperature):
    """logits / 1e-40 overflows to inf and its softmax is NaN: below SAMPLING_EPS the choice is the argmax (vLLM)."""
    from tokennet.sampling import SAMPLING_EPS

    assert temperature < SAMPLING_EPS
    prompt = torch.randint(40, (2, 4), generator=torch.Generator().manual_seed(1))
    greedy = generate(model, prompt, 10, temperature=0)
    assert torch.equal(generate(model, prompt, 10, temperature=temperature), greedy)
    logits = torch.tensor([[0.0, 3.0, 1e30, -1e30]])
    assert sample_next(logits, temperature=temperature).tolist() == [2]
