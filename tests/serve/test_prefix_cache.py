"""Prefix caching: requests sharing a prefix reuse its keys and values, and answer exactly as without the cache."""

import threading

import pytest
import torch

from tokennet.errors import ConfigError
from tokennet.models import create_model
from tokennet.serve.cache import PrefixCache
from tokennet.serve.engine import Engine, SamplingParams, Sequence
from tokennet.tokens.text import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,<|>_\n")
SYSTEM = "<|system|> you are a terse helper. answer in one word.\n"  # 56 tokens: 3 blocks of 16
TURNS = ["user: hello\n", "user: the quick brown fox\n", "user: lorem ipsum\n", "user: q\n", "user: xyzzy plugh\n"]


def _model(position="rope", **kw):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=160, position=position, **kw).eval()
    with torch.no_grad():  # large random weights: confident, varied next tokens
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


def _run(engine, prompts, max_tokens=12, at_once=True):
    """Submit the prompts (all at once, or each after the last finished); the sequences once all finished."""
    left = threading.Semaphore(0)
    seqs = [Sequence(TOK.encode(p), SamplingParams(max_tokens=max_tokens, temperature=0),
                     lambda e: left.release() if e.finish_reason else None) for p in prompts]
    for s in seqs:
        engine.submit(s)
        if not at_once:
            assert left.acquire(timeout=30)
    if at_once:
        for _ in seqs:
            assert left.acquire(timeout=30)
    return seqs


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_greedy_outputs_equal_with_and_without_the_cache(position):
    m = _model(position, num_kv_heads=2)
    prompts = [SYSTEM + t for t in TURNS]
    chat = SYSTEM + TURNS[0]  # a chat's next turn begins with its first turn and the reply
    plain = Engine(m, TOK, max_batch=3, prefix_cache_mb=0).start()
    cached = Engine(m, TOK, max_batch=3).start()
    try:
        assert plain.prefix is None and cached.prefix is not None
        ref = _run(plain, prompts)
        first = _run(cached, prompts[:1])  # fills the cache with the system prompt
        got = _run(cached, prompts)  # concurrent, sharing the system prompt (and the first prompt whole)
        again = _run(cached, prompts[::-1], at_once=False)  # one after the other, longer prefixes cached
        follow = chat + TOK.decode(first[0].generated) + TURNS[1]
        ref_follow = _run(plain, [follow])[0].generated
        got_follow = _run(cached, [follow])
    finally:
        plain.stop()
        cached.stop()
    assert [s.generated for s in got] == [s.generated for s in ref]
    assert [s.generated for s in again] == [s.generated for s in ref][::-1]
    assert got_follow[0].generated == ref_follow
    assert all(s.cached_tokens >= 48 for s in got)  # the system prompt's three whole blocks came from the cache
    assert got_follow[0].cached_tokens >= 64  # the earlier turn's prompt and reply too
    st = cached.status()["prefix_cache"]
    assert st["hits"] >= len(prompts) * 2 and st["bytes"] <= st["budget_bytes"]


def test_eviction_under_a_tiny_bound_keeps_answers_right():
    m = _model()
    c = m.config
    block_bytes = c.num_layers * 2 * c.num_heads * 16 * (c.dim // c.num_heads) * 4  # one block of 16 tokens, fp32
    prompts = [f"{w} " * 12 + "end\n" for w in ("ab", "cd", "ef", "gh")]  # different from their first block
    plain = Engine(m, TOK, max_batch=2, prefix_cache_mb=0).start()
    tiny = Engine(m, TOK, max_batch=2, prefix_cache_mb=3 * block_bytes / 2**20).start()  # three blocks
    try:
        ref = [s.generated for s in _run(plain, prompts)]
        for _ in range(2):
            assert [s.generated for s in _run(tiny, prompts, at_once=False)] == ref
            assert tiny.prefix.bytes <= 3 * block_bytes and len(tiny.prefix) <= 3
    finally:
        plain.stop()
        tiny.stop()
    assert tiny.prefix.evicted > 0


def test_a_prefix_evicted_while_its_request_waits_is_recomputed():
    m = _model()
    prompt = SYSTEM + TURNS[1]
    engine = Engine(m, TOK, max_batch=1)
    ref = _run(Engine(m, TOK, max_batch=1, prefix_cache_mb=0).start(), [prompt])[0].generated
    engine.start()
    try:
        _run(engine, [prompt])  # cached
        assert engine.prefix.match(TOK.encode(prompt))[0] >= 48
        gate = threading.Event()
        seen = threading.Semaphore(0)
        # a long request holds the only row; the next waits in the queue while its prefix is evicted
        long = Sequence(TOK.encode("zz"), SamplingParams(max_tokens=40, temperature=0),
                        lambda e: seen.release() if e.finish_reason else None)
        waiting = Sequence(TOK.encode(prompt), SamplingParams(max_tokens=12, temperature=0),
                           lambda e: seen.release() if e.finish_reason else None)
        real = engine._load_prefix

        def evict_first(seq, row):
            if seq is waiting:
                engine.prefix.clear()  # evicted while it waited
                gate.set()
            return real(seq, row)

        engine._load_prefix = evict_first
        engine.submit_all([long, waiting])
        assert seen.acquire(timeout=30) and seen.acquire(timeout=30)
    finally:
        engine.stop()
    assert gate.is_set() and waiting.cached_tokens == 0
    assert waiting.generated == ref


def test_a_prefix_the_tiny_cache_evicts_while_its_request_waits_is_recomputed():
    """No hook: a cache of three blocks holds the system prompt; while its request waits behind another, that
    one's blocks evict it (least recently used), and the request computes its prompt whole and answers right."""
    m = _model()
    c = m.config
    block_bytes = c.num_layers * 2 * c.num_heads * 16 * (c.dim // c.num_heads) * 4  # one block of 16 tokens, fp32
    prompt, other = SYSTEM + TURNS[1], "xy " * 20 + "end\n"  # 3 whole blocks each (in 3 blocks' room)
    ref = Engine(m, TOK, max_batch=1, prefix_cache_mb=0).start()
    want = [s.generated for s in _run(ref, [other, prompt], at_once=False)]
    ref.stop()
    engine = Engine(m, TOK, max_batch=1, prefix_cache_mb=3 * block_bytes / 2**20).start()
    try:
        _run(engine, [prompt])  # its first three blocks (the system prompt) are cached, and fill the cache
        assert engine.prefix.peek(TOK.encode(prompt)) == 48
        evicted = engine.prefix.evicted
        seqs = _run(engine, [other, prompt])  # one row: prompt waits while other's prefill evicts its blocks
    finally:
        engine.stop()
    assert engine.prefix.evicted >= evicted + 3
    assert seqs[1].cached_tokens == 0  # recomputed
    assert [s.generated for s in seqs] == want


def test_the_prefill_budget_counts_only_the_tokens_computed():
    """A prompt whose system prompt is cached costs this step's prefill budget only the tokens after it."""
    m = _model()
    engine = Engine(m, TOK, max_batch=3, prefill_tokens=64)  # not started: this test takes its steps
    first = Sequence(TOK.encode(SYSTEM + TURNS[0]), SamplingParams(max_tokens=4, temperature=0), lambda e: None)
    engine.submit(first)
    with torch.inference_mode():
        engine._admit()  # the system prompt's three blocks (48 tokens) cached by its prefill
        engine._remove(0, "length")
    prompts = [SYSTEM + t for t in (TURNS[3], TURNS[2], TURNS[4])]  # 64, 74, 74 tokens: 16, 26, 26 computed
    seqs = [Sequence(TOK.encode(p), SamplingParams(max_tokens=4, temperature=0), lambda e: None) for p in prompts]
    engine.submit_all(seqs)
    with torch.inference_mode():
        engine._admit()  # one step's admissions
    assert [s.cached_tokens for s in engine.running] == [48, 48]  # 16 + 26 = 42 of 64; not the third (68)
    assert len(engine.waiting) == 1


def test_blocks_match_only_their_exact_tokens_after_their_exact_parent():
    kv = [(torch.randn(2, 40, 8), torch.randn(2, 40, 8)) for _ in range(3)]  # 3 layers, (Hkv, 40 tokens, E)

    def read(a, b):
        return [(k[:, a:b], v[:, a:b]) for k, v in kv]

    pc = PrefixCache(1 << 20, block=8)
    toks = list(range(40))
    assert pc.insert(toks, read) == 5
    m, got = pc.match(toks, limit=39)  # at most all but the last token: whole blocks, 32 tokens
    assert m == 32 and torch.equal(got[2][0], kv[2][0][:, :32]) and torch.equal(got[1][1], kv[1][1][:, :32])
    assert pc.match([0] * 40)[0] == 0  # other first tokens: nothing
    assert pc.match(toks[:8] + [99] + toks[9:])[0] == 8  # a changed second block: only the first
    assert pc.match(toks[8:])[0] == 0  # the second block's tokens, but not after the first: nothing
    assert next(iter(pc.blocks))[1] == tuple(toks[32:40])  # least recently used: the deepest block, a leaf
    pc._drop((PrefixCache.ROOT, tuple(toks[:8])))  # dropping the first block drops its descendants
    assert len(pc) == 0 and pc.bytes == 0


def test_a_cache_larger_than_memory_is_refused_at_start():
    m = _model()
    with pytest.raises(ConfigError, match="does not fit") as e:
        Engine(m, TOK, prefix_cache_mb=2**40)  # a tebibyte of mebibytes
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=">= 0"):
        Engine(m, TOK, prefix_cache_mb=-1)


def test_serve_refuses_a_prefix_cache_larger_than_memory_in_one_line(tmp_path, capsys):
    pytest.importorskip("uvicorn")
    from tokennet.cli import main
    from tokennet.models import save_pretrained
    from tokennet.run import save_tokenizer, write_run_info

    run = tmp_path / "run"
    save_pretrained(_model(), run)
    save_tokenizer(run, TOK)
    write_run_info(run, recipe="gpt-char", model="gpt-micro", data=None, settings={})
    assert main(["serve", str(run), "--prefix-cache-mb", "1e12", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not fit" in err and "--prefix-cache-mb" in err and "\n" not in err
    assert main(["serve", str(run), "--prefix-cache-mb", "-3"]) == 2


def test_serve_decodes_with_its_fastest_copy_that_keeps_quality_and_says_which():
    pytest.importorskip("starlette")
    from tokennet.serve.app import serving_mode

    m = _model()
    assert serving_mode(m) == "int8"  # a float model on the CPU
    assert serving_mode(m, "none") == "none" and serving_mode(m, "int4") == "int4"
    engine = Engine(m, TOK, quantize=serving_mode(m), prefix_cache_mb=1)
    st = engine.status()  # what GET /health reports
    assert st["quantize"] == "int8" and st["prefix_cache"]["budget_bytes"] == 2**20
    # a run holding a GGUF file's Q8_0/Q4_0/Q4_1 blocks in every linear layer: its own blocks where the block
    # kernel multiplies them (eager and compiled alike), int8 where it does not
    from tokennet.layers import int8dot
    from tokennet.models import create_model

    gguf = {"decoder.blocks.*.attn.*_proj": "q4_1", "decoder.blocks.*.mlp.fc?": "q4_0", "tok_emb": "q8_0"}
    g = create_model("gpt-micro", vocab_size=64, block_size=16, quantized=gguf).eval()
    assert serving_mode(g) == ("int4" if int8dot.blocks_available() else "int8")
    some = create_model("gpt-micro", vocab_size=64, block_size=16, quantized={"decoder.blocks.*.mlp.fc1": "q4_1"})
    assert serving_mode(some) == "int8"  # float layers too: int4 would round them to 4 bits


def test_serve_int4_on_a_model_it_cannot_hold_falls_back_with_a_note_as_generate_does(caplog):
    from tokennet.sampling import generate

    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=64, dim=40).eval()  # 40: not blocks of 32
    with caplog.at_level("WARNING"):
        engine = Engine(m, TOK, max_batch=2, quantize="int4").start()
    assert "stay float32" in caplog.text
    try:
        s = _run(engine, ["hello world"], max_tokens=6)[0]
    finally:
        engine.stop()
    assert s.generated == generate(m, torch.tensor([s.prompt]), 6, temperature=0, quantize="int4")[0, -6:].tolist()


def test_serve_decodes_with_all_but_one_of_its_threads_by_default_and_says_how_many(tmp_path, capsys, monkeypatch):
    """The core left over runs the HTTP server (and its clients): serving_threads; --threads sets it; /health
    reports what the engine decodes with; a count below 1 is refused in one line."""
    pytest.importorskip("starlette")
    from tokennet.cli import main
    from tokennet.errors import RunError
    from tokennet.serve.app import serving_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert serving_threads() == 7 and serving_threads(3) == 3 and serving_threads(device="cuda") is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert serving_threads() == 1
    for bad in (0, -2, True, 1.5):
        with pytest.raises(RunError, match="threads"):
            serving_threads(bad)
    monkeypatch.undo()
    engine = Engine(_model(), TOK, prefix_cache_mb=1)
    assert engine.status()["threads"] == torch.get_num_threads()
    run = tmp_path / "run"
    run.mkdir()
    capsys.readouterr()
    assert main(["serve", str(run), "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads must be >= 1" in err and "\n" not in err.strip()
