"""logprobs / top_logprobs / echo: from the forward that samples, equal to log_softmax of tokennet's own logits."""

import pytest
import torch
from api_support import TOK, client, post, running, tiny_model

pytest.importorskip("uvicorn")
pytest.importorskip("openai")
from tokennet.serve.app import create_app  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def server():
    model = tiny_model()
    app = create_app(Engine(model, TOK, max_batch=4), model_name="tiny")
    with running(app) as port:
        yield {"port": port, "model": model}


def _lp(model, ids):
    """log_softmax of the model's own logits at every position: (T, V)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_completion_logprobs_equal_the_models_log_softmax(server):
    c = client(server["port"])
    prompt = TOK.encode("hello wor")
    r = c.completions.create(model="tiny", prompt="hello wor", max_tokens=10, temperature=1.0, seed=3, logprobs=5)
    ch = r.choices[0]
    lp = ch.logprobs
    assert "".join(lp.tokens) == ch.text and len(lp.tokens) == 10
    ids = [TOK.encode(t)[0] for t in lp.tokens]
    ref = _lp(server["model"], prompt + ids)  # (P + 10, V)
    for j, (t, got) in enumerate(zip(ids, lp.token_logprobs)):
        row = ref[len(prompt) - 1 + j]
        assert got == pytest.approx(float(row[t]), abs=1e-4)
        top = lp.top_logprobs[j]
        assert len(top) == 5 and max(top.values()) == pytest.approx(float(row.max()), abs=1e-4)
        want = {TOK.decode([int(i)], skip_special=False): float(row[i]) for i in row.topk(5).indices}
        assert top.keys() == want.keys() and all(top[k] == pytest.approx(v, abs=1e-4) for k, v in want.items())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(10)]


def test_echo_scores_the_prompt_as_lm_eval_asks(server):
    """lm-eval's local-completions: token ids, ``echo``, ``logprobs: 1``, ``max_tokens`` 1 (or 0), temperature 0."""
    prompts = [TOK.encode("the quick brown fox"), TOK.encode("ab")]
    for max_tokens in (0, 1):
        body = {"model": "tiny", "prompt": prompts, "temperature": 0, "max_tokens": max_tokens, "logprobs": 1,
                "seed": 1234, "echo": True}
        status, out = post(server["port"], "/v1/completions", body)
        assert status == 200, out
        for ch, ids in zip(sorted(out["choices"], key=lambda c: c["index"]), prompts):
            lp = ch["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids) + max_tokens and lp["token_logprobs"][0] is None
            assert ch["text"].startswith(TOK.decode(ids)) and lp["top_logprobs"][0] is None
            ref = _lp(server["model"], ids)
            want = [float(ref[j - 1, ids[j]]) for j in range(1, len(ids))]
            assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=1e-4)
            # lm-eval's parse_logprobs: the continuation's sum and whether it is greedy
            ctxlen = 2
            tail = lp["token_logprobs"][ctxlen : len(ids)]
            greedy = all(t == max(top.values()) for t, top in zip(tail, lp["top_logprobs"][ctxlen : len(ids)]))
            assert greedy == all(int(ref[j - 1].argmax()) == ids[j] for j in range(ctxlen, len(ids)))
            if max_tokens == 1:  # the greedy next token's logprob is the maximum
                assert lp["token_logprobs"][-1] == pytest.approx(float(ref[-1].max()), abs=1e-4)
            else:
                assert ch["finish_reason"] == "length" and ch["text"] == TOK.decode(ids)


def test_echo_without_logprobs_and_streamed(server):
    c = client(server["port"])
    whole = c.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, echo=True)
    assert whole.choices[0].text.startswith("abc") and whole.choices[0].logprobs is None
    parts = list(c.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, echo=True,
                                      logprobs=2, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    toks = [t for p in parts if p.choices[0].logprobs for t in p.choices[0].logprobs.tokens]
    assert "".join(toks) == whole.choices[0].text


def test_chat_logprobs_read_by_the_openai_client(server):
    c = client(server["port"])
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                  top_logprobs=3)
    content = r.choices[0].logprobs.content
    text = r.choices[0].message.content
    assert content and "".join(t.token for t in content).startswith(text)
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy
        assert bytes(t.bytes).decode() == t.token and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    streamed = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                              logprobs=True, stream=True))
    got = [t for p in streamed if p.choices and p.choices[0].logprobs for t in p.choices[0].logprobs.content]
    assert [t.logprob for t in got] == pytest.approx([t.logprob for t in content]) and not got[0].top_logprobs
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "a", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "a", "echo": "yes"}, "echo"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ("/v1/completions", {"prompt": "a", "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "logprobs": 3}, "logprobs"),
])
def test_bad_logprobs_are_400(server, path, body, param):
    status, out = post(server["port"], path, body)
    assert status == 400 and out["error"]["param"] == param, out
