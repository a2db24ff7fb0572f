"""GGUF vocabularies carry llama.cpp's token types: special tokens CONTROL (3), added tokens that are not special
USER_DEFINED (4), as llama.cpp's ``convert_hf_to_gguf.py`` writes them; reading the file back keeps a user-defined
token an added, non-special token (encoded whole, printed as text), so a round trip keeps every type."""

from __future__ import annotations

import pytest

import tokennet
from tokennet.interop import import_checkpoint
from tokennet.interop.export import export_run
from tokennet.models import create_model
from tokennet.models.registry import save_pretrained
from tokennet.run import save_tokenizer
from tokennet.tokens.pretrained import PretrainedTokenizer

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

CONTROL, USER_DEFINED, NORMAL = 3, 4, 1
TEMPLATE = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.content }}{{ eos_token }}{% endfor %}"


def _types(path) -> list[int]:
    f = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.token_type"]
    return [int(f.parts[i][0]) for i in f.data]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["call a tool, then answer: the weather is fine"] * 3, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    engine = bpe._tokenizer
    engine.add_tokens([tokenizers.AddedToken("<tool_call>", special=False, normalized=False)])
    tok = PretrainedTokenizer(engine, bos_id=engine.token_to_id("<|im_start|>"),
                              eos_id=engine.token_to_id("<|im_end|>"), chat_template=TEMPLATE)
    model = create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=32, position="rope",
                         norm_layer="rmsnorm", gated_mlp=True, activation="silu", bias=False, tie_weights=False)
    d = save_pretrained(model.eval(), tmp_path_factory.mktemp("types") / "run")
    save_tokenizer(d, tok)
    return tokennet.load(d)


def test_added_tokens_are_user_defined_and_come_back_as_added_non_special_tokens(run, tmp_path):
    tok = run.tokenizer
    tool, start, word = (tok._engine.token_to_id(t) for t in ("<tool_call>", "<|im_start|>", "the"))
    out = export_run(run, tmp_path / "m.gguf", "gguf", gguf_type="f32").path
    types = _types(out)
    assert types[tool] == USER_DEFINED and types[start] == CONTROL and types[word] == NORMAL
    assert types.count(USER_DEFINED) == 1 and types.count(CONTROL) == 3

    back = tokennet.load(import_checkpoint(out, tmp_path / "back").path).tokenizer
    text = "the <tool_call> is<|im_start|>"
    ids = back.encode(text)
    assert ids == tok.encode(text) and ids.count(tool) == 1 and ids.count(start) == 1  # matched whole
    assert back.decode(ids) == "the <tool_call> is"  # user-defined is text; control is skipped
    assert back.decode(ids, skip_special=False) == text
    assert back.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert back.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|im_start|><|im_start|>hi<|im_end|>"

    again = export_run(tokennet.load(tmp_path / "back"), tmp_path / "again.gguf", "gguf", gguf_type="f32").path
    assert _types(again) == types
