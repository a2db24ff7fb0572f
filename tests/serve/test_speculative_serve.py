"""Speculative decoding inside the server's continuous batch: rows that draft verify their drafts in the batch's one
forward, and what every request gets is what the plain server gives it (greedy: the same tokens; sampled: the same
distribution)."""

import threading

import pytest
import torch

from tokennet.layers import int8dot
from tokennet.models import create_model, save_pretrained
from tokennet.run import save_tokenizer, write_run_info
from tokennet.sampling import next_token_probs
from tokennet.serve.engine import Engine, SamplingParams, Sequence
from tokennet.speculative import Draft, VerifyCost
from tokennet.tokens.text import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,<|>_\n")
PROMPTS = ["aaaaaaaa", "abababab", "zzzz", "hello hello hello", "q q q q", "abc abc abc", "the quick brown fox"]


def _model(seed=0, vocab=TOK.vocab_size, block_size=96, **kw):
    torch.manual_seed(seed)
    m = create_model("gpt-micro", vocab_size=vocab, block_size=block_size, **kw).eval()
    with torch.no_grad():  # large random weights: confident, varied next tokens
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


MODEL = _model()


def _engine(model=MODEL, tokenizer=TOK, **kw) -> Engine:
    """A started eager engine whose rows draft from their first decoding step (no timing, no pauses)."""
    engine = Engine(model, tokenizer, compile=False, **{"max_batch": 4, **kw})
    engine.speculation.clock = None
    return engine.start()


def _run(engine, prompts, params):
    """Submit every prompt (text, or token ids) at once, wait for all, stop the engine: the sequences, each with the
    events it got (``.events``)."""
    done = threading.Semaphore(0)
    seqs = []
    for prompt, prm in zip(prompts, params):
        events = []
        ids = TOK.encode(prompt) if isinstance(prompt, str) else prompt
        seq = Sequence(ids, prm, lambda e, events=events: (events.append(e), e.finish_reason and done.release()))
        seq.events = events
        seqs.append(seq)
    try:
        engine.submit_all(seqs)
        for _ in seqs:
            assert done.acquire(timeout=60)
    finally:
        engine.stop()
    return seqs


@pytest.fixture(scope="module")
def plain():
    """The plain server's greedy sequences of PROMPTS (40 tokens)."""
    return _run(_engine(), PROMPTS, [SamplingParams(max_tokens=40, temperature=0) for _ in PROMPTS])


@pytest.mark.parametrize("mode", ["ngram", "draft-other", "draft-self"])
def test_greedy_speculating_rows_give_the_plain_servers_tokens(plain, mode):
    """Seven requests on four rows (joining and leaving), speculating ones beside plain ones, each with its own draft
    length: every text is the plain server's, token for token, in float32."""
    draft = {"ngram": None, "draft-other": _model(5), "draft-self": MODEL}[mode]
    engine = _engine(speculative="ngram" if draft is None else "draft", draft_model=draft)
    params = [SamplingParams(max_tokens=40, temperature=0, speculative=None if i % 3 else "off",
                             draft_tokens=[None, 2, 5][i % 3]) for i in range(len(PROMPTS))]
    seqs = _run(engine, PROMPTS, params)
    for got, want in zip(seqs, plain):
        assert got.generated == want.generated and got.text == want.text and got.finish_reason == "length"
        assert "".join(e.text for e in got.events) == want.text
    stats = engine.status()["speculative"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    if mode == "draft-self":  # the target drafting for itself: every draft is its own argmax
        assert stats["acceptance_rate"] > 0.9, stats
        assert engine.steps < sum(len(s.generated) for s in seqs) / 3


@pytest.mark.skipif(not int8dot.blocks_available(), reason="the int8dot block kernel does not run here")
def test_greedy_speculating_rows_of_an_int4_copy_give_the_plain_servers_tokens():
    """int8 activations (an int4 copy): the float steps before each rounding are pinned (tokennet.layers.pinned), so
    a verification's rows give each token a plain step's logits bit for bit, rows at other lengths beside them (their
    keys masked) included: the same greedy text, not one that parts at a near-tie. Compared by each token's log
    probability, exactly (the unpinned copy's differ in the last bits on every request: its tokens on this small,
    confident model do not)."""
    plain = _run(_engine(quantize="int4"), PROMPTS,
                 [SamplingParams(max_tokens=40, temperature=0, logprobs=0) for _ in PROMPTS])
    engine = _engine(quantize="int4", speculative="ngram")
    params = [SamplingParams(max_tokens=40, temperature=0, logprobs=0, draft_tokens=[None, 2, 5][i % 3])
              for i in range(len(PROMPTS))]
    seqs = _run(engine, PROMPTS, params)
    for got, want in zip(seqs, plain):
        assert got.generated == want.generated
        assert [t.logprob for t in got.logprobs] == [t.logprob for t in want.logprobs]
    assert engine.status()["speculative"]["accepted"] > 0


def _first_new(tokens, start):
    """The first token at or after ``start`` that does not occur before it."""
    return next(t for j, t in enumerate(tokens) if j >= start and t not in tokens[:j])


@pytest.mark.parametrize("limit", ["stop string", "stop token", "max tokens"])
def test_stops_budget_and_logprobs_inside_accepted_drafts(limit):
    """The target drafting for itself (drafts accepted six at a time): a stop string, a stop token or the token
    budget that falls inside a round's accepted drafts ends the text there, as in plain decoding, and each token's
    log probabilities are the plain server's."""
    prompt = "the quick brown fox"
    full = _run(_engine(), [prompt], [SamplingParams(max_tokens=40, temperature=0)])[0].generated
    base = dict(max_tokens=40, temperature=0, logprobs=3)
    if limit == "stop string":
        at = full.index(_first_new(full, 9))
        base["stop"] = [TOK.decode(full[at : at + 2])]
    elif limit == "stop token":
        base["stop_ids"] = [_first_new(full, 11)]
    else:
        base["max_tokens"] = 13
    want = _run(_engine(), [prompt], [SamplingParams(**base)])[0]
    engine = _engine(speculative="draft", draft_model=MODEL, draft_tokens=6)
    got = _run(engine, [prompt], [SamplingParams(**base)])[0]
    assert want.finish_reason == ("length" if limit == "max tokens" else "stop")
    assert (got.generated, got.text, got.finish_reason) == (want.generated, want.text, want.finish_reason)
    assert "".join(e.text for e in got.events) == want.text and len(got.generated) < 40
    streamed = [lp for e in got.events for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in want.logprobs]
    for a, b in zip(streamed, want.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and [t for t, _ in a.top] == [t for t, _ in b.top]
    assert engine.speculation.accepted >= 6


# -- sampled: the rejection rule keeps the distribution -----------------------------------------------------------

SMALL = CharTokenizer.train("abcd")  # 8 ids with its special tokens
V = SMALL.vocab_size


def _every_bigram(vocab: int) -> list[int]:
    """A sequence of ids holding every pair ``(a, b)`` once as neighbours (an Eulerian path of the complete graph
    with loops; 65 ids for 8): whatever a row samples first, its last two tokens occurred before, so it drafts."""
    left = {a: list(range(vocab)) for a in range(vocab)}
    path, stack = [], [0]
    while stack:  # Hierholzer's algorithm
        if left[stack[-1]]:
            stack.append(left[stack[-1]].pop())
        else:
            path.append(stack.pop())
    return path[::-1]


PAIRS = _every_bigram(V)


def _exact_pair(model, prompt, **sampling) -> torch.Tensor:
    """P(x₂, x₃ | prompt) ``(V, V)``: Σ over x₁ of p(x₁) p(x₂ | x₁) p(x₃ | x₁ x₂), the settings applied."""
    with torch.no_grad():
        first = next_token_probs(model(torch.tensor([prompt])).logits[:, -1], **sampling)[0]  # (V,)
        pairs = torch.tensor([[a, b] for a in range(V) for b in range(V)])  # (V², 2): x₁, x₂
        logits = model(torch.cat([torch.tensor(prompt).repeat(V * V, 1), pairs], dim=1)).logits  # (V², T+2, V)
        second = next_token_probs(logits[:, -2], **sampling).gather(1, pairs[:, 1:])[:, 0]  # p(x₂ | x₁)
        third = next_token_probs(logits[:, -1], **sampling)  # (V², V): p(x₃ | x₁ x₂)
    joint = first[pairs[:, 0]][:, None] * second[:, None] * third  # (V², V): P(x₁, x₂, x₃)
    return joint.reshape(V, V, V).sum(dim=0)


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of counts against probabilities; cells expected below 5 pooled into one."""
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = (probs.flatten() * counts.sum()).double()
    observed = counts.flatten().double()
    small = expected < 5
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    keep = expected > 0
    return float(scipy_stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum())
                 .pvalue)


@pytest.mark.parametrize("mode, sampling, n", [
    ("ngram", dict(temperature=1.0), 2000),
    ("draft", dict(temperature=0.8, top_k=6, top_p=0.95), 600),  # a draft model drafts each row alone: fewer draws
])
def test_sampled_tokens_follow_plain_samplings_distribution(mode, sampling, n):
    """``n`` requests of 4 tokens: the 2nd and 3rd (the first round's two drafts, accepted or rejected, then the
    residual or the bonus token) against P(x₂, x₃) computed exactly, by Pearson's chi-square over at most 64 cells
    (those expected below 5 pooled). Under a right rule the p-value is uniform: a threshold of 1e-3 fails it once in a
    thousand seeds (these are fixed). A wrong rule is far below it: checked by breaking it (a rejected position drawn
    from p instead of the residual norm(max(0, p − q))), the n-gram case gave p = 2e-15, against 0.13 with the right
    rule (8% of its drafts accepted)."""
    model = _model(0, vocab=V, block_size=96)
    draft = _model(5, vocab=V, block_size=96) if mode == "draft" else None
    engine = _engine(model, SMALL, speculative=mode, draft_model=draft, draft_tokens=2, max_batch=64, seed=3)
    params = [SamplingParams(max_tokens=4, top_k=sampling.get("top_k", 0), top_p=sampling.get("top_p", 1.0),
                             temperature=sampling["temperature"]) for _ in range(n)]
    seqs = _run(engine, [PAIRS] * n, params)
    counts = torch.zeros(V, V)
    for seq in seqs:
        counts[seq.generated[1], seq.generated[2]] += 1
    assert engine.speculation.verifications >= n and engine.speculation.drafted >= 2 * n  # every row drafted
    assert 0 < engine.speculation.accepted < engine.speculation.drafted
    assert _chi_square_p(counts, _exact_pair(model, PAIRS, **sampling)) > 1e-3


# -- faults ---------------------------------------------------------------------------------------------------------

def test_a_failing_verification_ends_only_its_sequence(plain):
    """A verification forward that raises for one row: that sequence ends with an error event, the others (drafting
    or not) finish with the plain server's tokens."""
    engine = _engine(speculative="draft", draft_model=MODEL, max_batch=8)
    victim = 3
    params = [SamplingParams(max_tokens=40, temperature=0, speculative="off" if i == 1 else None)
              for i in range(len(PROMPTS))]
    forward = engine.net.forward_features
    holder = {}

    def faulty(*args, **kwargs):
        seq = holder.get("victim")
        if engine.caches.mode == "verify" and seq in engine.feeding and len(seq.generated) >= 3:
            raise RuntimeError("injected fault")
        return forward(*args, **kwargs)

    engine.net.forward_features = faulty
    original = engine.submit_all

    def submit_all(seqs):
        holder["victim"] = seqs[victim]
        original(seqs)

    engine.submit_all = submit_all
    seqs = _run(engine, PROMPTS, params)
    assert seqs[victim].finish_reason == "error" and "injected fault" in seqs[victim].events[-1].error
    for i, (got, want) in enumerate(zip(seqs, plain)):
        if i != victim:
            assert got.generated == want.generated and got.finish_reason == "length"


def test_a_drafter_that_raises_costs_speculation_not_the_sequence(plain):
    engine = _engine(speculative="ngram")
    engine.ngram.propose = lambda *args: (_ for _ in ()).throw(RuntimeError("drafter broke"))
    seqs = _run(engine, PROMPTS[:3], [SamplingParams(max_tokens=40, temperature=0) for _ in range(3)])
    for got, want in zip(seqs, plain):
        assert got.generated == want.generated and got.finish_reason == "length"
    assert engine.speculation.drafted == 0


class _FixedCost(VerifyCost):
    """A verification that always costs ``ratio`` plain steps (a deterministic stand-in for the measured cost)."""

    def __init__(self, ratio):
        super().__init__()
        self.fixed = ratio

    def ratio(self, rows, drafts):
        return self.fixed


class _Proposing:
    """A free drafter that always proposes ``tokens``."""

    free_to_propose = True

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, seq, k):
        return Draft(self.tokens[:k])

    def rollback(self, length):
        pass


def test_drafts_that_fail_stop_being_verified_and_new_requests_start_from_what_failed(plain):
    """Drafts that are never right, at a verification cost of two plain steps: the batch of 4 verifies them twice
    (the prior acceptance, 0.8, expects 4 × 3.3 of 8 drafts accepted, and after one miss each 4 × 1.7, more than
    the 4 × 1.25 that repay a verification; after two misses 4 × 1.0), then every step is plain — the shadow checks
    keep each row's estimate low — and the engine's estimate for n-gram drafts, where a new request starts, has
    fallen too."""
    wrong = next(t for t in range(TOK.vocab_size) if all(t not in seq.generated for seq in plain[:4]))
    engine = Engine(MODEL, TOK, compile=False, max_batch=4, speculative="ngram")
    engine.speculation.cost = _FixedCost(2.0)
    engine.ngram = _Proposing([wrong] * 8)
    engine.start()
    seqs = _run(engine, PROMPTS[:4], [SamplingParams(max_tokens=40, temperature=0) for _ in range(4)])
    for got, want in zip(seqs, plain):
        assert got.generated == want.generated
    stats = engine.speculation
    assert stats.verifications == 8 and stats.accepted == 0 and stats.skipped >= 35, stats  # two steps of 4 rows
    assert stats.prior("ngram") < 0.2
    fresh = Sequence(TOK.encode("abc"), SamplingParams(max_tokens=5, temperature=0), lambda e: None)
    assert engine._drafting(fresh).length.acceptance == stats.prior("ngram")


def test_drafts_that_match_are_verified_in_the_batch(plain):
    """The same cost with drafts that are always right: nearly every step verifies, and each keeps its drafts."""
    engine = Engine(MODEL, TOK, compile=False, max_batch=1, speculative="ngram")
    engine.speculation.cost = _FixedCost(2.0)
    want = plain[0].generated

    class Right(_Proposing):
        def propose(self, seq, k):
            n = seq.shape[0] - len(TOK.encode(PROMPTS[0]))
            return Draft(want[n : n + k])

    engine.ngram = Right([])
    engine.start()
    (got,) = _run(engine, PROMPTS[:1], [SamplingParams(max_tokens=40, temperature=0)])
    assert got.generated == want
    stats = engine.speculation
    assert stats.accepted == stats.drafted > 20 and engine.steps <= 12, (stats, engine.steps)


def test_the_engine_refuses_speculation_it_cannot_follow():
    from tokennet.errors import ConfigError

    with pytest.raises(ConfigError, match="draft model"):
        Engine(MODEL, TOK, speculative="draft")
    with pytest.raises(ConfigError, match="between 1 and 95"):
        Engine(MODEL, TOK, draft_tokens=96)
    with pytest.raises(ConfigError, match="speculative must be one of"):
        Engine(MODEL, TOK, speculative="fast")
    engine = Engine(MODEL, TOK)
    for params, words in ((SamplingParams(speculative="draft"), "draft model"),
                          (SamplingParams(draft_tokens=0), "between 1 and 95")):
        with pytest.raises(ValueError, match=words):
            engine.submit(Sequence([1, 2], params, lambda e: None))


# -- HTTP and the command line ----------------------------------------------------------------------------------------

def test_request_fields_and_health():
    testclient = pytest.importorskip("starlette.testclient")
    from tokennet.serve.app import create_app

    engine = Engine(MODEL, TOK, max_batch=4, compile=False, speculative="ngram", draft_tokens=5)
    engine.speculation.clock = None
    with testclient.TestClient(create_app(engine, model_name="tiny")) as client:
        for extra, param in (({"speculative": "draft"}, "speculative"), ({"speculative": "fast"}, "speculative"),
                             ({"draft_tokens": 0}, "draft_tokens"), ({"draft_tokens": "3"}, "draft_tokens"),
                             ({"draft_tokens": 96}, "draft_tokens"), ({"draft_tokens": True}, "draft_tokens")):
            r = client.post("/v1/completions", json={"prompt": "ab", **extra})
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == param and "\n" not in err["message"], (extra, err)
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "speculative": "draft"})
        assert r.status_code == 400 and "--draft" in r.json()["error"]["message"]
        texts = {}
        for mode in ("off", "ngram", None):
            body = {"prompt": ["hello hello hello", "abc abc abc"], "max_tokens": 30, "temperature": 0,
                    **({} if mode is None else {"speculative": mode, "draft_tokens": 3})}
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            texts[mode] = [choice["text"] for choice in r.json()["choices"]]
        assert texts["ngram"] == texts["off"] == texts[None]
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi hi hi"}],
                                                      "max_tokens": 10, "speculative": "ngram", "draft_tokens": 2})
        assert r.status_code == 200, r.text
        health = client.get("/health").json()["speculative"]
    assert set(health) == {"mode", "draft", "draft_tokens", "drafted", "accepted", "verifications", "skipped",
                           "acceptance_rate"}
    assert health["mode"] == "ngram" and health["draft"] is None and health["draft_tokens"] == 5
    assert health["drafted"] > 0 and 0 <= health["acceptance_rate"] <= 1


def _save_run(path, tokenizer, block_size=64):
    save_pretrained(create_model("gpt-micro", vocab_size=tokenizer.vocab_size, block_size=block_size), path)
    save_tokenizer(path, tokenizer)
    write_run_info(path, recipe="gpt-char", model="gpt-micro", data=None, settings={})
    return str(path)


def test_serve_refuses_bad_speculation_in_one_line_and_says_its_mode(tmp_path, capsys, monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn

    from tokennet.cli import main

    target = _save_run(tmp_path / "target", TOK)
    other = _save_run(tmp_path / "other", CharTokenizer.train("0123456789"))
    for flags, words in ((["--speculative", "ngram", "--draft-tokens", "0"], "--draft-tokens must be >= 1"),
                         (["--speculative", "ngram", "--draft-tokens", "64"], "between 1 and 63"),
                         (["--speculative", "draft"], "needs a draft run"),
                         (["--draft", other], "different tokenizers")):
        assert main(["serve", target, "--no-compile", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tokennet: error:") and words in err and "\n" not in err, (flags, err)
        if "--draft" in flags:
            assert target in err and other in err
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)  # the start line only: nothing is served
    assert main(["serve", target, "--no-compile", "--draft", target, "--draft-tokens", "3"]) == 0
    assert f"speculative draft: drafts from {target}, up to 3 a round" in capsys.readouterr().err
