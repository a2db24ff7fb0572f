"""One sequence's failure is its own: faults injected into the engine end that sequence with an error event, and
every other sequence completes with the tokens it gets without the fault."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tokennet.models import create_model
from tokennet.sampling import generate
from tokennet.serve.cache import SlotCaches
from tokennet.serve.engine import SAMPLING_EPS, Engine, SamplingParams, Sequence, sample_rows
from tokennet.tokens.text import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n")
PROMPTS = ["hello world", "ab", "the quick brown fox", "zz", "lorem ipsum"]
BAD = 3  # the index of the prompt a fault is injected for


def _model(block_size=64):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=block_size).eval()
    with torch.no_grad():  # large random weights: confident, varied next tokens
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


MODEL = _model()


def _greedy(m, prompt, n):
    ids = TOK.encode(prompt)
    return generate(m, torch.tensor([ids]), n, temperature=0)[0, len(ids):].tolist()


def _seqs(prompts, params):
    """Sequences that record their events; ``done`` is released once per finished sequence."""
    done = threading.Semaphore(0)
    def recorder(events):
        return lambda e: (events.append(e), done.release() if e.finish_reason else None)

    seqs = []
    for p, prm in zip(prompts, params):
        events = []
        s = Sequence(TOK.encode(p), prm, recorder(events))
        s.events = events
        seqs.append(s)
    return seqs, done


def _run(engine, prompts, params):
    """Every sequence submitted before the engine starts (so they share every step), run to the end."""
    seqs, done = _seqs(prompts, params)
    engine.submit_all(seqs)
    engine.start()
    try:
        for _ in seqs:
            assert done.acquire(timeout=60), [s.finish_reason for s in seqs]
    finally:
        engine.stop()
    assert not engine._thread.is_alive()
    return seqs


def _text(s):
    return "".join(e.text for e in s.events)


def _error_of(s):
    assert s.finish_reason == "error", s.finish_reason
    last = s.events[-1]
    assert last.finish_reason == "error" and last.error
    return last.error


def _check_the_others(seqs, n):
    for i, s in enumerate(seqs):
        if i != BAD:
            assert s.finish_reason == "length" and s.generated == _greedy(MODEL, PROMPTS[i], n), PROMPTS[i]
            assert _text(s) == TOK.decode(s.generated)


def _raise_for(engine, victim, mode, after=0):
    """Make the engine's forward raise whenever ``victim`` is fed in a ``mode`` forward (after ``after`` tokens)."""
    ff = engine.net.forward_features

    def faulty(*a, **kw):
        if engine.caches.mode == mode and victim in engine.feeding and len(victim.generated) >= after:
            raise RuntimeError("injected fault")
        return ff(*a, **kw)

    engine.net.forward_features = faulty


def test_tiny_temperature_is_greedy_beside_greedy_rows():
    """temperature 1e-40 beside four greedy sequences: all five finish, the tiny one with the greedy tokens."""
    params = [SamplingParams(max_tokens=12, temperature=0) for _ in PROMPTS]
    params[BAD] = SamplingParams(max_tokens=12, temperature=1e-40)
    seqs = _run(Engine(MODEL, TOK, max_batch=8), PROMPTS, params)
    for s, p in zip(seqs, PROMPTS):
        assert s.finish_reason == "length" and s.generated == _greedy(MODEL, p, 12)


def test_sample_rows_greedy_below_eps_and_a_bad_row_alone():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    logits[1, 4] = float("nan")
    params = [SamplingParams(temperature=SAMPLING_EPS / 10), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, seed=1)]
    gens = [None, None, torch.Generator().manual_seed(1)]
    errors = {}
    out = sample_rows(logits, params, gens, torch.Generator().manual_seed(0), errors=errors)
    assert list(errors) == [1] and "NaN" in errors[1] and int(out[1]) == -1
    assert int(out[0]) == int(logits[0].argmax())
    alone = sample_rows(logits[2:], params[2:], [torch.Generator().manual_seed(1)])
    assert int(out[2]) == int(alone[0])  # the bad row changed nothing for the others
    with pytest.raises(ValueError, match="row 1"):  # without errors=: the failure is raised
        sample_rows(logits, params, gens)


def test_nan_logits_of_one_row_end_that_sequence_only():
    engine = Engine(MODEL, TOK, max_batch=8)
    params = [SamplingParams(max_tokens=10, temperature=0) for _ in PROMPTS]
    seqs, done = _seqs(PROMPTS, params)
    victim = seqs[BAD]
    head = engine.net.forward_head

    def nan_head(h):
        out = head(h)
        if engine.caches.mode == "decode" and victim in engine.feeding and len(victim.generated) >= 4:
            out = out.clone()
            out[engine.feeding.index(victim)] = float("nan")
        return out

    engine.net.forward_head = nan_head
    engine.submit_all(seqs)
    engine.start()
    try:
        for _ in seqs:
            assert done.acquire(timeout=60)
    finally:
        engine.stop()
    assert "NaN" in _error_of(victim) and len(victim.generated) == 4
    _check_the_others(seqs, 10)


def test_a_decode_forward_that_raises_for_one_sequence_fails_it_alone():
    engine = Engine(MODEL, TOK, max_batch=8)
    seqs, done = _seqs(PROMPTS, [SamplingParams(max_tokens=15, temperature=0) for _ in PROMPTS])
    _raise_for(engine, seqs[BAD], "decode", after=5)
    engine.submit_all(seqs)
    engine.start()
    try:
        for _ in seqs:
            assert done.acquire(timeout=60)
    finally:
        engine.stop()
    assert "injected fault" in _error_of(seqs[BAD])
    assert len(seqs[BAD].generated) == 5 and _text(seqs[BAD]) == TOK.decode(seqs[BAD].generated)
    _check_the_others(seqs, 15)
    assert engine.finished == {"length": 4, "error": 1}


def test_a_prefill_that_raises_fails_its_sequence_and_the_drain_ends():
    engine = Engine(MODEL, TOK, max_batch=8)
    seqs, done = _seqs(PROMPTS, [SamplingParams(max_tokens=12, temperature=0) for _ in PROMPTS])
    _raise_for(engine, seqs[BAD], "prefill")
    engine.submit_all(seqs)
    engine.start()
    try:
        for _ in seqs:
            assert done.acquire(timeout=60)
    finally:
        engine.stop(timeout=30)
    assert not engine._thread.is_alive()
    assert "injected fault" in _error_of(seqs[BAD]) and seqs[BAD].generated == []
    _check_the_others(seqs, 12)


def _failing_alloc(after):
    calls = {"n": 0}

    def alloc(like, capacity):
        calls["n"] += 1
        if calls["n"] > after:
            raise torch.OutOfMemoryError("injected: out of memory")
        return like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])

    return alloc


def test_a_cache_that_cannot_grow_is_left_as_it_was():
    caches = SlotCaches(3, 2, 4, slots=2, max_len=64, capacity=8)
    for c in caches.layers:
        c.k.normal_()
    before = [c.k.clone() for c in caches.layers]
    caches._alloc = _failing_alloc(after=3)  # half-way through the 6 new buffers
    with pytest.raises(torch.OutOfMemoryError):
        caches.ensure(20)
    assert caches.capacity == 8 and all(c.k.shape[2] == c.v.shape[2] == 8 for c in caches.layers)
    del caches._alloc
    caches.ensure(20)
    assert caches.capacity == 32 and all(c.k.shape[2] == c.v.shape[2] == 32 for c in caches.layers)
    for c, b in zip(caches.layers, before):
        assert torch.equal(c.k[:, :, :8], b)


@pytest.mark.parametrize("where", ["decode", "prefill"])
def test_an_allocation_failure_while_growing_fails_only_the_sequence_that_needs_it(where):
    m = _model(block_size=320)
    engine = Engine(m, TOK, max_batch=4)
    assert engine.caches.capacity == 256
    long = "abcdefghij" * (25 if where == "decode" else 28)  # 250 tokens need a bigger cache after 7 new; 280 at once
    prompts = ["hello", long, "ab", "the quick"]
    seqs, done = _seqs(prompts, [SamplingParams(max_tokens=30, temperature=0) for _ in prompts])
    engine.caches._alloc = _failing_alloc(after=1)
    engine.submit_all(seqs)
    engine.start()
    try:
        for _ in seqs:
            assert done.acquire(timeout=60)
    finally:
        engine.stop()
    assert "out of memory" in _error_of(seqs[1])
    assert len(seqs[1].generated) == (7 if where == "decode" else 0)  # 250 + 7 tokens: past 256
    assert engine.caches.capacity == 256
    assert all(c.k.shape[2] == c.v.shape[2] == 256 for c in engine.caches.layers)
    for i in (0, 2, 3):
        ids = TOK.encode(prompts[i])
        ref = generate(m, torch.tensor([ids]), 30, temperature=0)[0, len(ids):].tolist()
        assert seqs[i].finish_reason == "length" and seqs[i].generated == ref


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_seeded_sequence_samples_on_the_engine_device(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = _model().to(device)
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=5)
    engine = Engine(m, TOK, max_batch=4)
    seqs = _run(engine, ["hello", "ab"], [params, SamplingParams(max_tokens=10, temperature=0)])
    assert seqs[0].generator.device == engine.device and seqs[0].finish_reason == "length"
    again = _run(Engine(m, TOK, max_batch=4), ["hello"], [params])
    assert again[0].generated == seqs[0].generated


def test_a_drain_that_runs_out_of_time_answers_every_sequence():
    engine = Engine(MODEL, TOK, max_batch=2)
    head = engine.net.forward_head
    engine.net.forward_head = lambda h: (time.sleep(0.01), head(h))[1]  # 60 tokens: at least 0.6 s
    prompts = ["a", "b", "c", "d"]  # two of them wait for a row
    seqs, done = _seqs(prompts, [SamplingParams(max_tokens=60, temperature=0) for _ in prompts])
    engine.submit_all(seqs)
    engine.start()
    engine.stop(timeout=0.05)
    engine._thread.join(10)  # the step in progress when the drain gave up ends first
    assert not engine._thread.is_alive()
    for _ in seqs:
        assert done.acquire(timeout=10)
    assert all(s.finish_reason == "error" and "shutting down" in s.events[-1].error for s in seqs)
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit(Sequence([1], SamplingParams(), lambda e: None))


def test_an_engine_never_started_answers_its_sequences_when_stopped():
    engine = Engine(MODEL, TOK, max_batch=2)
    seqs, done = _seqs(["a"], [SamplingParams(max_tokens=3)])
    engine.submit_all(seqs)
    engine.stop()
    assert done.acquire(timeout=1) and seqs[0].finish_reason == "error"


# -- over HTTP -------------------------------------------------------------------------------------------
testclient = pytest.importorskip("starlette.testclient")


def _faulty_app(where):
    from tokennet.serve.app import create_app

    engine = Engine(MODEL, TOK, max_batch=8)
    ff = engine.net.forward_features
    victim = TOK.encode(PROMPTS[BAD])

    def faulty(*a, **kw):
        if engine.caches.mode == where and any(s.prompt == victim for s in engine.feeding):
            if where == "prefill" or any(len(s.generated) >= 3 for s in engine.feeding if s.prompt == victim):
                raise RuntimeError("injected fault")
        return ff(*a, **kw)

    engine.net.forward_features = faulty
    return create_app(engine, model_name="tiny"), engine


def _sse(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_over_http_the_faulty_request_gets_an_error_and_the_others_their_text(where):
    app, engine = _faulty_app(where)
    with testclient.TestClient(app) as c:
        def one(i, stream):
            body = {"prompt": PROMPTS[i], "max_tokens": 10, "temperature": 0, "stream": stream}
            return c.post("/v1/completions", json=body)

        with ThreadPoolExecutor(8) as pool:
            whole = list(pool.map(lambda i: one(i, False), range(len(PROMPTS))))
            streams = list(pool.map(lambda i: one(i, True), range(len(PROMPTS))))
    assert not engine._thread.is_alive()  # the drain ended
    for i, (w, s) in enumerate(zip(whole, streams)):
        events = _sse(s.text)
        assert s.status_code == 200 and s.text.rstrip().endswith("data: [DONE]")
        if i == BAD:
            assert w.status_code == 500, w.text
            err = w.json()["error"]
            assert err["type"] == "server_error" and "injected fault" in err["message"]
            assert "injected fault" in events[-1]["error"]["message"]
        else:
            ref = TOK.decode(_greedy(MODEL, PROMPTS[i], 10))
            assert w.status_code == 200 and w.json()["choices"][0]["text"] == ref
            assert "".join(e["choices"][0]["text"] for e in events) == ref
            assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_over_http_a_tiny_temperature_beside_greedy_requests_all_succeed():
    from tokennet.serve.app import create_app

    with testclient.TestClient(create_app(Engine(MODEL, TOK, max_batch=8), model_name="tiny")) as c:
        def one(i):
            body = {"prompt": PROMPTS[i], "max_tokens": 10, "temperature": 1e-40 if i == BAD else 0}
            return c.post("/v1/completions", json=body)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(len(PROMPTS))))
    for p, r in zip(PROMPTS, answers):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == TOK.decode(_greedy(MODEL, p, 10))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, on purpose
def test_an_engine_thread_that_dies_answers_what_it_held_and_refuses_more():
    engine = Engine(MODEL, TOK, max_batch=2)
    seqs, done = _seqs(["a", "b", "c"], [SamplingParams(max_tokens=5, temperature=0)] * 3)

    def dying(*a, **kw):
        raise SystemExit("injected: the thread is told to end")  # not an Exception: nothing in a step catches it

    engine.net.forward_features = dying
    engine.submit_all(seqs)
    engine.start()
    for _ in seqs:
        assert done.acquire(timeout=30)
    engine._thread.join(10)
    assert all(s.finish_reason == "error" for s in seqs)
    with pytest.raises(RuntimeError, match="thread has ended"):
        engine.submit(Sequence([1], SamplingParams(max_tokens=2), lambda e: None))
