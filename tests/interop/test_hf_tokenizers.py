"""Imported GPT-2 and Llama directories bring their tokenizers: ids equal ``transformers``' tokenizer, and
``tokennet generate --prompt`` on the imported run prints what ``transformers``' greedy ``generate`` decodes."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tokennet import load
from tokennet.cli import main
from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "To be, or not to be: that is the question.",
          "Tokens for every modality: text, images, audio, graphs — 224×224 pixels, 16×16 patches!",
          "def f(x):\n    return x ** 2  # 1234567890"]
TEXTS = ["The quick brown fox", " leading space and  two", "émigré naïve 日本 🙂", "x = 42\n\ty", "",
         "<|endoftext|>after a special token"]


def _byte_bpe(vocab_size: int = 320, specials=("<|endoftext|>",)):
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS * 5, vocab_size=vocab_size, min_frequency=1, special_tokens=list(specials))
    return tok._tokenizer


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from tests.interop.conftest import randomize

    engine = _byte_bpe()
    hf_tok = transformers.GPT2TokenizerFast(tokenizer_object=engine, bos_token="<|endoftext|>",
                                            eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    cfg = transformers.GPT2Config(vocab_size=engine.get_vocab_size(), n_positions=64, n_embd=24, n_layer=2,
                                  n_head=3, bos_token_id=0, eos_token_id=0)
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    randomize(transformers.GPT2LMHeadModel(cfg)).save_pretrained(d)
    hf_tok.save_pretrained(d)
    engine.model.save(str(d))  # GPT-2's older form beside tokenizer.json: vocab.json + merges.txt
    assert (d / "vocab.json").is_file() and (d / "merges.txt").is_file()
    return d


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.interop.conftest import randomize

    engine = _byte_bpe(specials=("<s>", "</s>"))
    engine.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", engine.token_to_id("<s>"))])
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=engine, bos_token="<s>", eos_token="</s>")
    hf_tok.chat_template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    cfg = transformers.LlamaConfig(vocab_size=engine.get_vocab_size(), hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False,
                                   bos_token_id=engine.token_to_id("<s>"), eos_token_id=engine.token_to_id("</s>"))
    d = tmp_path_factory.mktemp("hf") / "llama"
    randomize(transformers.LlamaForCausalLM(cfg)).save_pretrained(d)
    hf_tok.save_pretrained(d)
    return d


def _copy(src, tmp_path, drop=()):
    d = tmp_path / "src"
    shutil.copytree(src, d)
    for name in drop:
        (d / name).unlink()
    return d


@pytest.mark.parametrize("form", ["tokenizer.json", "vocab.json + merges.txt"])
def test_gpt2_tokenizer_equals_transformers(gpt2_dir, tmp_path, form):
    src = _copy(gpt2_dir, tmp_path, drop=["tokenizer.json"] if form != "tokenizer.json" else [])
    assert (src / "tokenizer.json").exists() == (form == "tokenizer.json")
    result = import_checkpoint(src, tmp_path / "run")
    assert result.tokenizer is not None and not any("tokenizer" in n for n in result.notes)
    ref = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    tok = load(tmp_path / "run").tokenizer  # as saved in the run directory, read back
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref(text)["input_ids"], text
        assert tok.decode(ids, skip_special=False) == ref.decode(ids), text
    assert tok.eos_id == ref.eos_token_id and tok.stop_ids == [ref.eos_token_id]


def test_llama_tokenizer_adds_bos_like_transformers_and_keeps_the_chat_template(llama_dir, tmp_path):
    import_checkpoint(llama_dir, tmp_path / "run")
    tok = load(tmp_path / "run").tokenizer
    ref = transformers.AutoTokenizer.from_pretrained(llama_dir)
    for text in TEXTS:
        assert tok.encode(text) == ref(text)["input_ids"], text
    assert tok.encode("hi")[0] == ref.bos_token_id
    assert tok.eos_id == ref.eos_token_id
    msgs = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(msgs) == ref.apply_chat_template(msgs, tokenize=False)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_generate_prompt_on_imported_run_equals_transformers_greedy(which, gpt2_dir, llama_dir, tmp_path, capsys):
    src = gpt2_dir if which == "gpt2" else llama_dir
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    prompt = "The quick brown"
    assert main(["generate", str(tmp_path / "run"), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    ref_tok = transformers.AutoTokenizer.from_pretrained(src)
    cls = transformers.GPT2LMHeadModel if which == "gpt2" else transformers.LlamaForCausalLM
    ref = cls.from_pretrained(src).eval()
    enc = ref_tok(prompt, return_tensors="pt")  # with its attention mask: Llama's <s> is id 0, like a pad id
    ids = enc["input_ids"]
    with torch.no_grad():
        seq = ref.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=ref_tok.eos_token_id)
    new = ref_tok.decode(seq[0, ids.shape[1]:], skip_special_tokens=True)
    assert new and new in out, (new, out)


def test_tokenizer_larger_than_the_model_is_refused(gpt2_dir, tmp_path):
    src = _copy(gpt2_dir, tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    small = cfg["vocab_size"] - 10
    cfg["vocab_size"] = small
    (src / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file
    sd = load_file(str(src / "model.safetensors"))
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"][:small].contiguous()
    sd.pop("lm_head.weight", None)
    save_file(sd, str(src / "model.safetensors"))
    with pytest.raises(TokennetError, match="do not belong together"):
        import_checkpoint(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_malformed_tokenizer_json_is_one_line_and_writes_nothing(gpt2_dir, tmp_path, capsys):
    src = _copy(gpt2_dir, tmp_path)
    (src / "tokenizer.json").write_text("{nope")
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "tokenizer.json" in err and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_eval_on_an_imported_run_equals_transformers_loss(gpt2_dir, tmp_path, capsys):
    """``tokennet eval IMPORTED --data FILE``: mean next-token loss over non-overlapping windows of the context."""
    import_checkpoint(gpt2_dir, tmp_path / "run")
    text = "\n".join(CORPUS * 4)
    (tmp_path / "text.txt").write_text(text)
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt")]) == 0
    got = json.loads(capsys.readouterr().out)
    ref_tok = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    ref = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    ids = ref_tok(text)["input_ids"]
    block = ref.config.n_positions
    assert len(ids) > 3 * block  # several windows, the last one short
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, block):
            w = torch.tensor([ids[s:s + block + 1]])
            logits = ref(w[:, :-1]).logits
            total += float(torch.nn.functional.cross_entropy(logits[0], w[0, 1:], reduction="sum"))
            count += w.shape[1] - 1
    assert got["tokens"] == count == len(ids) - 1 and got["window"] == block and not got["truncated"]
    assert got["loss"] == pytest.approx(total / count, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


@pytest.mark.parametrize("args, expected", [([], "give --data FILE"), (["--data", "missing.txt"], "no such file")])
def test_eval_on_an_imported_run_needs_a_text_file(gpt2_dir, tmp_path, capsys, args, expected):
    import_checkpoint(gpt2_dir, tmp_path / "run")
    assert main(["eval", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
