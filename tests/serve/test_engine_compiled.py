"""The serving engine's compiled decoding step (RowsStep): the eager engine's tokens, a bounded number of graphs over
a session of varied lengths and concurrency, the int8 copy compiled, and eager with one note where it does not
compile. The suite decodes eagerly (tests/conftest.py); the tests that compile are marked slow except one, small."""

from __future__ import annotations

import logging
import random
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from tokennet.serve.engine import Engine, SamplingParams, Sequence
from tokennet.tokens.text import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefgh ")


def _model(spread: bool = True, **kw):
    torch.manual_seed(0)
    from tokennet.models import create_model

    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=96, position="rope", num_kv_heads=2,
                     **kw).eval()
    with torch.no_grad():  # large random weights: confident, varied next tokens
        for p in m.parameters():
            if p.dim() > 1 and spread:
                p.normal_(0.0, 0.3)
    return m


def _run(engine, prompts, params):
    """Submit every prompt at once; wait until all finished; the sequences."""
    left = threading.Semaphore(0)
    seqs = [Sequence(TOK.encode(p), prm, lambda e: left.release() if e.finish_reason else None)
            for p, prm in zip(prompts, params)]
    engine.submit_all(seqs)
    for _ in seqs:
        assert left.acquire(timeout=60)
    assert all(s.finish_reason in ("stop", "length") for s in seqs)
    return seqs


def _session(engine, rounds):
    """Rounds of greedy requests of varied lengths, ``conc`` at once; each round's generated ids."""
    rnd = random.Random(0)
    out = []
    for conc in rounds:
        prompts = ["".join(rnd.choice("abcdefgh ") for _ in range(rnd.randint(1, 30))) for _ in range(conc)]
        params = [SamplingParams(max_tokens=rnd.randint(2, 40), temperature=0) for _ in range(conc)]
        out.append([s.generated for s in _run(engine, prompts, params)])
    return out


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _trace_with(step, backend, name: str) -> None:
    """Compile ``step``'s own code with ``backend`` (no Inductor: the graph runs as traced, in seconds), under a
    code name of its own so that no other test's graphs are shared."""
    import types

    fn = type(step)._step
    code = fn.__code__.replace(co_name=name)
    step.fn = torch.compile(types.MethodType(types.FunctionType(code, fn.__globals__), step), fullgraph=True,
                            dynamic=False, backend=backend)


@pytest.mark.slow  # two compilations: ~25 s with Inductor's cache warm, minutes cold on a shared machine
def test_the_compiled_engine_gives_the_eager_tokens_and_its_graphs_stop_growing():
    m = _model(num_layers=1)
    rounds = [1, 3, 4, 2, 1, 4, 3]
    eager = Engine(m, TOK, max_batch=4, compile=False).start()
    want = _session(eager, rounds)
    eager.stop()
    engine = Engine(m, TOK, max_batch=4, compile=True)
    assert engine.warm_up() is not None, "the engine's decoding step did not compile here"
    assert engine.status()["compile"]["compiled"] is True and engine.warm_up_s > 0
    after_warm_up = _graphs()
    engine.start()
    got = _session(engine, rounds)
    engine.stop()
    assert got == want
    assert _graphs() == after_warm_up  # warm_up compiled every graph the session needed (1 row; 2 rows and more)


@pytest.mark.slow
def test_the_int8_copy_compiles_and_its_logits_are_the_eager_ones():
    """serve's default on the CPU (--quantize auto → int8): teacher-forced, the compiled batch's logits equal the
    eager batch's within bfloat16's rounding (int8 computes in bfloat16: greedy tokens may part at a near-tie)."""
    engine = Engine(_model(spread=False), TOK, max_batch=5, quantize="int8", compile=True)  # logits of a usual size
    seqs = [Sequence(TOK.encode(p), SamplingParams(max_tokens=20, temperature=0), lambda e: None)
            for p in ["abc", "h", "a bad cafe", "ggg", "deaf bead hag"]]
    engine.submit_all(seqs)
    with torch.inference_mode():
        engine._admit()  # every prompt prefilled: five rows at lengths 3, 1, 10, 3, 13
        for B in (5, 1, 2):
            del engine.running[B:]
            compiled = engine._forward_rows(0, B)  # writes each row's next key and value
            assert engine.step.compiled is True
            step, engine.step = engine.step, None
            eager = engine._forward_rows(0, B)  # the same slots, the same values
            engine.step = step
            torch.testing.assert_close(compiled.float(), eager.float(), rtol=3e-2, atol=3e-2)


def test_the_traced_step_fuses_the_rows_mask_into_its_attention_and_gives_the_eager_tokens():
    """What Dynamo captures of the engine's step (no Inductor: the graph runs as traced, in seconds): the rows' key
    mask goes into the step's own attention (one_query_attention), never an SDPA call per layer, as in
    sampling.stream's step; and the tokens are the eager engine's, one row and several."""

    m = _model(num_layers=2)
    rounds = [1, 3, 2]
    eager = Engine(m, TOK, max_batch=3, compile=False).start()
    want = _session(eager, rounds)
    eager.stop()
    engine = Engine(m, TOK, max_batch=3, compile=True)
    step, graphs = engine.step, []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    _trace_with(step, backend, "_step_traced_for_a_test")
    engine.start()
    got = _session(engine, rounds)
    engine.stop()
    assert step.compiled is True and graphs
    assert got == want
    called = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert not [c for c in called if "scaled_dot_product" in c], called
    assert any("softmax" in c for c in called)  # the attention is in the graph, written out


def test_requests_are_answered_eagerly_while_the_step_compiles_in_the_background():
    """``tokennet serve`` takes requests at once: the step compiles in a thread of its own (here a traced graph held
    back until released, standing for a slow Inductor compile) over caches of its own; meanwhile the engine
    decodes eagerly, and the first step after it is ready runs compiled, with the eager engine's tokens."""
    m = _model(num_layers=1)
    eager = Engine(m, TOK, max_batch=3, compile=False).start()
    want_first, want_rest = _session(eager, [2]), _session(eager, [1, 3])
    eager.stop()
    engine = Engine(m, TOK, max_batch=3, compile=True)
    step, release, traced = engine.step, threading.Event(), []

    def slow_backend(gm, example_inputs):
        assert release.wait(60), "the test never released the compile"
        traced.append(threading.current_thread().name)
        return gm.forward

    _trace_with(step, slow_backend, "_step_held_back_for_a_test")
    engine.start()
    assert engine.warm_up_in_background() and not engine.warm_up_in_background()  # one compile at a time
    assert engine.status()["compile"]["ready"] is False
    first = _session(engine, [2])  # answered while the compile is held: eagerly
    assert first == want_first and not traced and step.compiled is None
    release.set()
    engine._warming.join(60)
    assert engine.status()["compile"]["ready"] is True
    assert step.compiled is True and set(traced) == {"tokennet-compile"}  # traced in the background thread
    steps_before = engine.steps
    rest = _session(engine, [1, 3])
    engine.stop()
    assert rest == want_rest and engine.steps > steps_before
    assert set(traced) == {"tokennet-compile"}  # the engine's steps reused the graphs: nothing traced again


def test_the_steps_views_of_the_rows_are_kept_until_the_buffers_grow():
    """RowsStep hands the graph rows 0..B−1 of every layer's buffers: made once per batch size, views of the
    buffers themselves (the graph's writes land in the cache), made again once the cache has grown."""
    from tokennet.serve.cache import SlotCaches
    from tokennet.serve.engine import RowsStep

    caches = SlotCaches(2, 1, 4, 3, 64, capacity=8)
    one, two = RowsStep._views(caches, 1), RowsStep._views(caches, 2)
    assert RowsStep._views(caches, 1) is one and RowsStep._views(caches, 2) is two
    assert len(two) == 2 and two[1][0].shape == (2, 1, 8, 4)
    two[1][1][1, 0, 3] = 7.0  # a write through the view is a write into the cache
    assert caches.layers[1].v[1, 0, 3, 0] == 7.0
    caches.ensure(20)  # new buffers
    grown = RowsStep._views(caches, 2)
    assert grown is not two and grown[1][1].shape == (2, 1, 32, 4)
    assert grown[1][1].untyped_storage().data_ptr() == caches.layers[1].v.untyped_storage().data_ptr()
    assert caches.layers[1].v[1, 0, 3, 0] == 7.0  # the grown cache kept the row


def test_a_failing_compiler_decodes_eagerly_with_one_note(caplog):
    """No C++ compiler (or an operation Dynamo cannot trace): one warning, then the eager engine's tokens."""
    m = _model(num_layers=1)
    eager = Engine(m, TOK, max_batch=3, compile=False).start()
    want = _session(eager, [2, 3])
    eager.stop()
    engine = Engine(m, TOK, max_batch=3, compile=True)

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nsecond line")

    engine.step.fn = broken
    with caplog.at_level(logging.WARNING, logger="tokennet.sampling"):
        assert engine.warm_up() is None
        engine.start()
        got = _session(engine, [2, 3])
        engine.stop()
    assert got == want
    notes = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "tokennet.sampling"]
    assert len(notes) == 1 and "no C++ compiler found" in notes[0]
    assert engine.status()["compile"]["compiled"] is False


def test_compile_follows_the_environment_and_the_argument(monkeypatch):
    m = _model(num_layers=1)
    monkeypatch.setenv("TOKENNET_COMPILE", "0")
    e = Engine(m, TOK, max_batch=2)
    assert e.step is None and e.warm_up() is None and e.status()["compile"]["compiled"] is False
    assert Engine(m, TOK, max_batch=2, compile=True).step is not None
    monkeypatch.delenv("TOKENNET_COMPILE")
    e = Engine(m, TOK, max_batch=2)  # a user's default: compiled
    assert e.step is not None and e.status()["compile"]["compiled"] is None  # not tried until warm_up / a step
    assert Engine(m, TOK, max_batch=2, compile=False).step is None  # --no-compile


def test_serve_passes_no_compile_and_the_default(monkeypatch):
    pytest.importorskip("uvicorn")
    import tokennet.serve.app as app
    from tokennet.cli import main

    got = []
    monkeypatch.setattr(app, "serve", lambda run_dir, **kw: got.append(kw["compile"]))
    assert main(["serve", "RUN", "--no-compile"]) == 0
    assert main(["serve", "RUN"]) == 0
    assert got == [False, None]  # None: compiled unless TOKENNET_COMPILE=0 (the engine decides)
