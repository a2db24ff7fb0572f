"""Speculative decoding (tokennet.speculative): greedy output equal to plain decoding, sampled output distributed as
plain sampling (the rejection rule of Leviathan et al. 2023 / Chen et al. 2023), the cache rolled back, bad input."""

import itertools

import pytest
import torch

from tokennet.errors import TokennetError
from tokennet.models import create_model
from tokennet.sampling import generate, next_token_probs
from tokennet.speculative import (
    Draft,
    DraftLength,
    ModelDrafter,
    NgramDrafter,
    SpeculationStats,
    VerifyCost,
    accept_sampled,
    stream_speculative,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed: int, vocab: int = 40, block: int = 32, std: float = 0.3, **kw):
    """A small GPT with large seeded random weight matrices: varied, non-degenerate next-token distributions (at
    the initialization's scale every model mostly repeats its input, and any draft would be right)."""
    torch.manual_seed(seed)
    model = create_model("gpt-micro", vocab_size=vocab, block_size=block, **kw).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    return model


def speculative(model, prompt, n, drafter, k=4, **kw) -> tuple[torch.Tensor, SpeculationStats]:
    stats = SpeculationStats()
    new = list(stream_speculative(model, prompt, n, drafter=drafter, draft_tokens=k, stats=stats, compile=False,
                                  draft_length=DraftLength(k, clock=None), **kw))
    return torch.cat([prompt[0], *new]), stats


MODELS = {
    "learned": dict(),
    "rope": dict(position="rope"),
    "alibi": dict(position="alibi"),
    "windowed": dict(position="rope", attention_windows=[4, 0]),
}

PROMPTS = {
    "random": torch.randint(40, (1, 7), generator=torch.Generator().manual_seed(3)),
    "repeating": torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]]),
    "one token": torch.tensor([[11]]),
    "past the context": torch.randint(40, (1, 40), generator=torch.Generator().manual_seed(4)),  # > block 32
}


@pytest.mark.parametrize("family", MODELS)
def test_greedy_equals_plain_decoding(family):
    """Every drafter, over several prompts, gives plain greedy decoding's tokens; 60 new tokens run past the
    context of 32, through plain decoding's window restarts."""
    model = tiny(0, **MODELS[family])
    other = tiny(1, **MODELS[family])  # a draft model whose drafts mostly fail
    for name, prompt in PROMPTS.items():
        want = generate(model, prompt, 60, temperature=0, compile=False)[0]
        for drafter in (NgramDrafter(), NgramDrafter(min_ngram=1),
                        ModelDrafter(model, 40, temperature=0, compile=False),
                        ModelDrafter(other, 40, temperature=0, compile=False)):
            got, stats = speculative(model, prompt, 60, drafter, k=5, temperature=0)
            assert torch.equal(got, want), (family, name, type(drafter).__name__)
            assert stats.tokens == 60


def test_drafts_are_verified_and_rejections_rolled_back():
    """The model as its own draft is always right; another model's drafts are mostly wrong, and a rejected draft
    left in the cache would change the next tokens (the equality above would then fail)."""
    model, other = tiny(0), tiny(1)
    prompt = PROMPTS["random"]
    _, itself = speculative(model, prompt, 20, ModelDrafter(model, 40, temperature=0, compile=False), temperature=0)
    assert itself.drafted > 0 and itself.accepted == itself.drafted
    assert itself.verifications < 20  # several tokens per target forward
    _, failing = speculative(model, prompt, 20, ModelDrafter(other, 40, temperature=0, compile=False), temperature=0)
    assert failing.accepted < failing.drafted


def test_ngram_lookup_proposes_what_followed_the_last_occurrence():
    seq = torch.tensor([1, 2, 3, 4, 9, 1, 2, 3, 7, 5, 2, 3])
    assert NgramDrafter(max_ngram=3, min_ngram=2).propose(seq, 3).tokens == [7, 5, 2]  # (2, 3): the latest
    assert NgramDrafter(max_ngram=3, min_ngram=2).propose(seq[:8], 2).tokens == [4, 9]  # (1, 2, 3) first
    assert NgramDrafter(max_ngram=3, min_ngram=2).propose(torch.tensor([1, 2, 3, 4]), 2).tokens == []
    assert NgramDrafter(min_ngram=1).propose(torch.tensor([4, 1, 2, 4]), 5).tokens == [1, 2, 4]


def test_stop_token_ends_a_speculative_round():
    model = tiny(0)
    prompt = PROMPTS["repeating"]
    plain = generate(model, prompt, 30, temperature=0, compile=False)[0, prompt.shape[1]:].tolist()
    stop = plain[5]
    got, _ = speculative(model, prompt, 30, NgramDrafter(min_ngram=1), temperature=0, stop=stop)
    assert got[prompt.shape[1]:].tolist() == plain[: plain.index(stop) + 1]


def test_acceptance_estimate_counts_rounds_and_shadow_checks():
    policy = DraftLength(8, clock=None, prior=0.6, drift=0.1)
    a = policy.acceptance
    policy.round_done(4, 4)  # four acceptances, no rejection
    assert policy.acceptance == pytest.approx(1 - (1 - a) * 0.8 ** 4)
    a = policy.acceptance
    policy.round_done(3, 0)  # one rejection: the drafts after it were never judged
    assert policy.acceptance == pytest.approx(0.8 * a)
    a = policy.acceptance
    policy.plain_done(shadow=True)  # the plain step's token was the first draft
    assert policy.acceptance == pytest.approx(a + 0.2 * (1 - a))
    for _ in range(30):
        policy.plain_done(shadow=False)
    assert policy.acceptance < 0.01
    a = policy.acceptance
    policy.plain_done()  # nothing proposed: back toward the prior
    assert policy.acceptance == pytest.approx(a + 0.1 * (0.6 - a))
    for alpha, k in itertools.product([0.0, 0.3, 0.9, 1.0], [1, 2, 5]):
        policy.acceptance = alpha
        assert policy.expected(k) == pytest.approx(sum(alpha ** j for j in range(1, k + 1)))


def test_verify_cost_fits_a_line_in_the_drafts_and_picks_the_fastest_width():
    cost = VerifyCost()
    for rows, drafts in itertools.product([1, 8], [1, 4, 8]):  # nothing timed: the prior
        assert cost.ratio(rows, drafts) == pytest.approx(VerifyCost.prior(rows, drafts))
    cost.verify_done(1, 3, 1.0)  # no plain step to compare with yet: not recorded
    assert 1 not in cost.fits
    cost.plain_done(1, 5.0)  # the first plain step of a batch size is warm-up
    cost.plain_done(1, 0.01)
    for _ in range(60):  # verifications of 2 drafts cost 2 plain steps, of 6 drafts 4
        cost.verify_done(1, 2, 0.02)
        cost.verify_done(1, 6, 0.04)
    # the timed verifications outweigh the prior's two points ten to one
    assert cost.ratio(1, 2) == pytest.approx(2.0, abs=0.15) and cost.ratio(1, 4) == pytest.approx(3.0, abs=0.15)
    assert cost.ratio(8, 4) == pytest.approx(VerifyCost.prior(8, 4))  # each batch size its own line

    def fastest(rows, expected, most):  # the width with the most tokens a second that repays its cost, by brute force
        rates = {d: (rows + expected(d)) / (rows * cost.ratio(rows, d)) for d in range(1, most + 1)
                 if expected(d) > VerifyCost.MARGIN * rows * (cost.ratio(rows, d) - 1)}
        return max(rates, key=rates.get) if rates and max(rates.values()) > 1 else 0

    for alpha in (0.0, 0.5, 0.8, 0.95, 1.0):
        expected = lambda d, a=alpha: sum(a ** j for j in range(1, d + 1))  # noqa: E731
        assert cost.best(1, expected, 8) == fastest(1, expected, 8), alpha
    assert cost.best(1, lambda d: 0.0, 8) == 0  # drafts that fail: a plain step
    assert cost.best(1, lambda d: float(d), 8) == 8  # drafts always right: the widest
    assert VerifyCost(clock=None).best(8, lambda d: 0.0, 5) == 5  # untimed: every draft
    zero = VerifyCost()
    zero.plain_done(1, 0.0)
    zero.plain_done(1, 0.0)
    zero.verify_done(1, 2, 0.0)
    assert 1 not in zero.fits  # a clock too coarse to time a step


def test_choose_waits_then_follows_the_expected_gain():
    policy = DraftLength(8, clock=lambda: 0.0, plain_first=2)
    assert [policy.choose(8) for _ in range(2)] == [0, 0]
    assert policy.choose(8) > 0  # the prior acceptance, 0.8, against the prior cost
    for _ in range(10):
        policy.plain_done(shadow=False)
    assert policy.choose(8) == 0  # the drafts stopped matching
    for _ in range(20):
        policy.plain_done(shadow=True)
    assert policy.choose(8) == 8 and policy.choose(3) == 3
    assert DraftLength(8, clock=None).choose(5) == 5


class Fixed(VerifyCost):
    """A verification that always costs ``ratio`` plain steps (a deterministic stand-in for the measured cost)."""

    def __init__(self, ratio):
        super().__init__()
        self.fixed = ratio

    def ratio(self, rows, drafts):
        return self.fixed


class ListDrafter:
    """Proposes the given tokens wherever the text is: the right continuation (``right``) or never it."""

    free_to_propose = True

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, seq, k):
        return Draft(self.tokens[: k])

    def rollback(self, length):
        pass


def test_drafts_that_fail_stop_being_verified():
    """A drafter whose drafts are never right, at a verification cost of two plain steps: two verifications (the
    prior acceptance, 0.8, expects 2.4 of 4 drafts accepted, and after one miss 1.5, more than the 1.25 that repay
    one; after two misses 1.0), then the shadow checks keep the acceptance low and the steps are plain ones (a
    workload where drafts fail decodes as plain decoding does)."""
    model, prompt = tiny(0), PROMPTS["random"]
    plain = generate(model, prompt, 40, temperature=0, compile=False)[0, prompt.shape[1]:].tolist()
    wrong = next(t for t in range(40) if t not in plain)
    policy = DraftLength(4, clock=lambda: 0.0, plain_first=0)
    policy.cost = Fixed(2.0)
    stats = SpeculationStats()
    got = list(stream_speculative(model, prompt, 40, drafter=ListDrafter([wrong] * 4), draft_tokens=4,
                                  stats=stats, compile=False, draft_length=policy, temperature=0))
    assert torch.cat(got).tolist() == plain
    assert stats.verifications == 2 and stats.plain_steps == 38 and policy.acceptance < 0.05


def test_drafts_that_match_are_verified():
    model, prompt = tiny(0), PROMPTS["random"]
    plain = generate(model, prompt, 40, temperature=0, compile=False)[0, prompt.shape[1]:].tolist()

    class Oracle(ListDrafter):
        def propose(self, seq, k):
            n = seq.shape[0] - prompt.shape[1]
            return Draft(plain[n : n + k])

    policy = DraftLength(4, clock=lambda: 0.0, plain_first=0)
    policy.cost = Fixed(2.0)
    stats = SpeculationStats()
    got = list(stream_speculative(model, prompt, 40, drafter=Oracle([]), draft_tokens=4, stats=stats,
                                  compile=False, draft_length=policy, temperature=0))
    assert torch.cat(got).tolist() == plain
    assert stats.accepted == stats.drafted and stats.verifications <= 10


# -- the rejection rule: sampled output distributed as plain sampling --------------------------------------------

def exact_next_two(model, prompt, **sampling) -> torch.Tensor:
    """P(x₁, x₂ | prompt) ``(V, V)`` = p(x₁ | prompt) · p(x₂ | prompt, x₁), with the sampling settings applied."""
    V = model.config.vocab_size
    with torch.no_grad():
        first = next_token_probs(model(prompt).logits[:, -1], **sampling)[0]  # (V,)
        rows = torch.cat([prompt.repeat(V, 1), torch.arange(V)[:, None]], dim=1)  # (V, T+1)
        second = next_token_probs(model(rows).logits[:, -1], **sampling)  # (V, V)
    return first[:, None] * second


def sampled_next_two(model, prompt, drafter_for, n: int, **sampling) -> torch.Tensor:
    """Counts ``(V, V)`` of the first two of three speculative tokens over ``n`` draws (one verification of two
    drafts, then whatever the rule leaves)."""
    V = model.config.vocab_size
    counts = torch.zeros(V, V)
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        out = list(stream_speculative(model, prompt, 3, drafter=drafter_for(g), draft_tokens=2, generator=g,
                                      compile=False, draft_length=DraftLength(2, clock=None), **sampling))
        counts[int(out[0]), int(out[1])] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of counts against probabilities; cells expected below 5 pooled into one."""
    scipy_stats = pytest.importorskip("scipy.stats")
    n = counts.sum()
    expected = (probs * n).flatten().double()
    counts = counts.flatten().double()
    small = expected < 5
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    counts = torch.cat([counts[~small], counts[small].sum()[None]])
    keep = expected > 0
    return float(scipy_stats.chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue)


V = 8
SETTINGS = {"t=1": dict(temperature=1.0), "t=0.8, top-k 6, top-p 0.95": dict(temperature=0.8, top_k=6, top_p=0.95)}


def repeating_prompt(model) -> torch.Tensor:
    """``[1, 2, c, 1, 2]``, whose n-gram draft is ``c, 1``, with ``c`` the token whose probability after it is nearest
    0.4: drafts then are accepted and rejected often, and a wrong rule shows."""
    with torch.no_grad():
        probs = [float(next_token_probs(model(torch.tensor([[1, 2, c, 1, 2]])).logits[:, -1])[0, c]) for c in range(V)]
    c = min(range(V), key=lambda c: abs(probs[c] - 0.4))
    return torch.tensor([[1, 2, c, 1, 2]])


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_sampled_tokens_follow_the_exact_distribution(kind, setting):
    """1000 draws of two tokens against P(x₁, x₂) computed exactly, V = 8. Checked by breaking the rule: drawing
    a rejected position from p instead of norm(max(0, p − q)) gave p-values of 3e-34 (n-gram, t=1), 2e-38 (n-gram,
    top-k/top-p) and 2e-22 (draft model, t=1) at 1000 draws (1e-70, 4e-76 and 3e-51 at 2000), far below the 1e-4
    the test asks; the draft model under top-k/top-p shows that break only weakly (p = 0.96: its q and p nearly
    agree there), so it checks the processed distributions, not the residual."""
    sampling = SETTINGS[setting]
    model = tiny(0, vocab=V, block=16)
    prompt = repeating_prompt(model)
    if kind == "ngram":
        def drafter_for(g):
            return NgramDrafter(min_ngram=1)
    else:
        draft = tiny(5, vocab=V, block=16)

        def drafter_for(g):
            return ModelDrafter(draft, V, generator=g, compile=False, **sampling)
    counts = sampled_next_two(model, prompt, drafter_for, 1000, **sampling)
    assert chi_square_p_value(counts, exact_next_two(model, prompt, **sampling)) > 1e-4


def test_rule_keeps_the_target_distribution_for_any_draft():
    """accept_sampled alone: the first token is distributed as p₁ for a draft drawn from q₁ (Leviathan et al.'s
    Theorem 3.5, k = 1), over 20000 draws of a 5-token vocabulary."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.5, 0.1, 0.1, 0.1, 0.2]])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(20000):
        x = int(torch.multinomial(q[0], 1, generator=g))
        counts[accept_sampled(p, Draft([x], q), g)[0]] += 1
    assert counts[4] == 0  # p₁ gives token 4 nothing, though the draft proposes it a fifth of the time
    assert chi_square_p_value(counts, p[0]) > 1e-4


# -- bad input ---------------------------------------------------------------------------------------------------

def test_bad_draft_lengths_and_models_are_refused():
    model = tiny(0, block=16)
    prompt = torch.tensor([[1, 2]])
    for k in (0, -1, 16, 100):
        with pytest.raises(TokennetError, match="draft_tokens must be between 1 and 15"):
            next(stream_speculative(model, prompt, 4, drafter=NgramDrafter(), draft_tokens=k))
    with pytest.raises(TokennetError, match="one sequence"):
        next(stream_speculative(model, torch.ones(2, 3, dtype=torch.long), 4, drafter=NgramDrafter()))
    classifier = create_model("vit-digits")  # a model that cannot decode
    with pytest.raises(TokennetError, match="not a causal language model"):
        next(stream_speculative(classifier, prompt, 4, drafter=NgramDrafter()))
    with pytest.raises(TokennetError, match="not a causal language model"):
        ModelDrafter(classifier, 40)


def test_every_combination_of_drafts_is_exact_for_greedy():
    """A exhaustive small case: every 2-token draft after a prompt, verified greedily, gives plain decoding."""
    model = tiny(0, vocab=5, block=16)
    prompt = torch.tensor([[1, 2, 3]])
    want = generate(model, prompt, 3, temperature=0, compile=False)[0, 3:].tolist()

    class Fixed:
        def __init__(self, tokens):
            self.tokens = tokens

        def propose(self, seq, k):
            return Draft(self.tokens[:k])

        def rollback(self, length):
            pass

    for draft in itertools.product(range(5), repeat=2):
        got, _ = speculative(model, prompt, 3, Fixed(list(draft)), k=2, temperature=0)
        assert got[3:].tolist() == want, draft


def test_random_models_are_not_degenerate():
    """The models above continue differently, so a draft model's drafts do fail (the tests would show nothing if
    every model repeated its input)."""
    prompt = PROMPTS["random"]
    a, b = (generate(tiny(s), prompt, 20, temperature=0, compile=False)[0, 7:] for s in (0, 1))
    assert (a != b).float().mean() > 0.5 and len(set(a.tolist())) > 5


# -- the command line and run.generate -------------------------------------------------------------------------

TINY = ["--set", "dim=32", "num_layers=1", "num_heads=2", "block_size=16", "batch_size=4", "eval_iters=2",
        "sample_tokens=20", "warmup_iters=2", "eval_interval=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A target and a draft char run on the same corpus (the same tokenizer), one on other text, one not a
    language model."""
    from tokennet.cli import main

    d = tmp_path_factory.mktemp("spec-runs")
    other = d / "other.txt"
    other.write_text("ZYXW VUTS 0123 " * 200)
    out = {"target": d / "target", "draft": d / "draft", "other": d / "other", "counter": d / "counter"}
    for name, data, extra in (("target", corpus, ["--set", "seed=0"]), ("draft", corpus, ["--set", "seed=1"]),
                              ("other", other, [])):
        assert main(["-q", "train", "gpt-char", "--data", str(data), "--out", str(out[name]), "--max-iters", "8",
                     *TINY, *extra]) == 0
    assert main(["-q", "train", "count-ones", "--out", str(out["counter"]), "--max-iters", "2", "--set", "dim=16",
                 "batch_size=16", "test_size=64"]) == 0
    return out


def cli(args, capsys) -> tuple[int, str, str]:
    from tokennet.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_speculative_gives_plain_text_and_reports_acceptance(runs, capsys):
    base = ["generate", str(runs["target"]), "--prompt", "line 1: the quick brown fox jumps over the lazy dog.\nline",
            "--max-new-tokens", "40", "--temperature", "0", "--no-compile"]
    code, plain, _ = cli(base, capsys)
    assert code == 0
    for extra, says in ((["--speculative", "ngram"], "n-gram drafts"),
                        (["--draft", str(runs["draft"]), "--draft-tokens", "3"], str(runs["draft"])),
                        (["--speculative", "draft", "--draft", str(runs["target"])], str(runs["target"]))):
        code, out, err = cli(base + extra, capsys)
        assert code == 0 and out == plain, extra
        lines = [x for x in err.splitlines() if x.startswith("speculative decoding")]
        assert len(lines) == 2 and says in lines[0] and "accepted" in lines[1] and "drafted" in lines[1], err


def test_cli_refuses_bad_speculation_in_one_line(runs, capsys):
    target = str(runs["target"])
    cases = [
        ([target, "--speculative", "ngram", "--draft-tokens", "0"], "--draft-tokens must be >= 1"),
        ([target, "--speculative", "ngram", "--draft-tokens", "-3"], "--draft-tokens must be >= 1"),
        ([target, "--speculative", "ngram", "--draft-tokens", "16"], "between 1 and 15"),
        ([target, "--speculative", "ngram", "--draft-tokens", str(10**9)], "between 1 and 15"),
        ([target, "--draft", str(runs["other"])], "different tokenizers"),
        ([target, "--speculative", "draft"], "needs a draft run"),
        ([target, "--draft", str(runs["counter"])], "not a language model"),
        ([target, "--speculative", "ngram", "--no-cache"], "KV cache"),
        ([target, "--speculative", "ngram", "--draft", str(runs["draft"])], "n-gram drafts"),
        ([str(runs["counter"]), "--speculative", "ngram", "--bits", "0110"], "--speculative does not apply"),
    ]
    for args, msg in cases:
        prompt = [] if "--bits" in args else ["--prompt", "line"]
        code, out, err = cli(["generate", *args, *prompt], capsys)
        assert code == 2 and out == "", args  # refused before the prompt is echoed
        assert err.startswith("tokennet: error:") and err.count("\n") == 1 and msg in err, (args, err)
    _, _, err = cli(["generate", target, "--draft", str(runs["other"]), "--prompt", "x"], capsys)
    assert str(runs["other"]) in err and target in err  # names both runs


def test_run_generate_speculative_python_api(runs):
    import tokennet
    from tokennet.errors import RunError

    run = tokennet.load(runs["target"])
    prompt = "line 7: the quick brown fox"
    plain = run.generate(prompt, 30, temperature=0, compile=False)
    stats = SpeculationStats()
    assert run.generate(prompt, 30, temperature=0, compile=False, speculative="ngram", stats=stats) == plain
    assert stats.tokens == 30 and stats.plain_steps + stats.verifications > 0  # whether drafts are verified: timed
    assert run.generate(prompt, 30, temperature=0, compile=False, draft=tokennet.load(runs["draft"])) == plain
    with pytest.raises(RunError, match="one prompt at a time"):
        run.generate([prompt, prompt], 5, speculative="ngram")


@pytest.mark.slow  # a compilation (~15 s); tests/test_step_store.py holds the compiled verification to the eager one
def test_compiled_speculation_verifies_in_the_compiled_graph_and_gives_plain_text(monkeypatch, tmp_path):
    """With --compile the plain steps and every verification (any number of drafts) run compiled: greedy text is
    plain decoding's (float32: the sums' order changes nothing at these margins), past the context too."""
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))
    model = tiny(0, position="rope")
    for prompt in (PROMPTS["repeating"], PROMPTS["past the context"]):
        want = generate(model, prompt, 40, temperature=0, compile=False)[0]
        stats = SpeculationStats()
        new = list(stream_speculative(model, prompt, 40, drafter=NgramDrafter(min_ngram=1), draft_tokens=5,
                                      stats=stats, compile=True, draft_length=DraftLength(5, clock=None),
                                      temperature=0))
        got = torch.cat([prompt[0], *new])
        # float sums in another order (the compiled graph's) may flip a rare near-tie: most tokens, and the first 20
        assert (got == want).float().mean().item() >= 0.95 and torch.equal(got[:20], want[:20])
        assert stats.verifications > 0
    from tokennet.layers.quantize import decoding_copy
    from tokennet.sampling import VerifyStep, compiled_step

    verify = compiled_step(decoding_copy(model, "none"), VerifyStep)
    assert verify.compiled and list(verify._fns) == ["K"]  # one graph for every draft length
