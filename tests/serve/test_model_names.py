"""--model-name aliases and --any-model-name: which names a request's ``model`` may give."""

import pytest
from api_support import TOK, client, post, running, tiny_model

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
from tokennet.cli import build_parser  # noqa: E402
from tokennet.serve.app import create_app  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_aliases_are_served_and_another_name_is_a_404_naming_them(model):
    app = create_app(Engine(model, TOK, max_batch=2), model_name=["tiny", "tiny-alias"])
    with running(app) as port:
        c = client(port)
        assert [m.id for m in c.models.list().data] == ["tiny", "tiny-alias"]
        assert c.models.retrieve("tiny-alias").id == "tiny-alias"
        for name in ("tiny", "tiny-alias"):
            r = c.completions.create(model=name, prompt="ab", max_tokens=3, temperature=0)
            assert r.model == name and len(r.choices[0].text) == 3
        with pytest.raises(openai.NotFoundError) as e:
            c.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "a"}])
        msg = e.value.body["message"]
        assert "'gpt-3.5-turbo'" in msg and "'tiny'" in msg and "'tiny-alias'" in msg and "--any-model-name" in msg
        assert post(port, "/v1/completions", {"prompt": "a", "model": "nope"})[0] == 404
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("nope")


def test_any_model_name_accepts_what_a_client_sends(model):
    app = create_app(Engine(model, TOK, max_batch=2), model_name="tiny", any_model_name=True)
    with running(app) as port:
        c = client(port)
        r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}],
                                      max_tokens=3, temperature=0)
        assert r.model == "gpt-4o-mini" and r.choices[0].message.role == "assistant"
        assert c.models.retrieve("anything").id == "anything"
        assert [m.id for m in c.models.list().data] == ["tiny"]
        status, out = post(port, "/v1/completions", {"prompt": "a", "model": 3})  # still a string
        assert status == 400 and out["error"]["param"] == "model"


def test_the_cli_flags():
    a = build_parser().parse_args(["serve", "RUN", "--model-name", "a", "--model-name", "b", "--any-model-name"])
    assert a.model_name == ["a", "b"] and a.any_model_name
    a = build_parser().parse_args(["serve", "RUN"])
    assert a.model_name is None and not a.any_model_name
