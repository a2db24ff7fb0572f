"""Chat data: rendered with the tokenizer's template, the loss only on the assistant's tokens, bad records named."""

import json

import pytest
import tokenizers
import torch

from tokennet.data.chats import ChatBatches, read_chats
from tokennet.errors import DataError
from tokennet.tokens.chat import render_chat
from tokennet.tokens.pretrained import PretrainedTokenizer
from tokennet.tokens.text import CharTokenizer

SMOLLM2_TEMPLATE = (  # SmolLM2-Instruct's own (ChatML, with a default system message)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "Six, of course."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi there."}],
]


@pytest.fixture(scope="module")
def chatml_tokenizer():
    bpe = tokenizers.ByteLevelBPETokenizer()
    texts = [m["content"] for c in CHATS for m in c] + ["You are a helpful AI assistant", "system user assistant"]
    bpe.train_from_iterator(texts * 3, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<|im_start|>", "<|im_end|>"])
    engine = bpe._tokenizer
    # Like Llama's tokenizers: every encoded text starts with <s> (the chat data must add it once, not per piece).
    engine.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", engine.token_to_id("<s>"))])
    return PretrainedTokenizer(engine, bos_id=engine.token_to_id("<s>"), eos_id=engine.token_to_id("<|im_end|>"),
                               chat_template=SMOLLM2_TEMPLATE, add_special=True)


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _learned_text(tok, x, y):
    """The text of every target token, one string per stretch of consecutive targets."""
    out, run = [], []
    for t in range(y.shape[0]):
        if y[t] >= 0:
            run.append(int(y[t]))
        elif run:
            out.append(tok.decode(run, skip_special=False))
            run = []
    if run:
        out.append(tok.decode(run, skip_special=False))
    return out


@pytest.mark.parametrize("kind", ["template", "plain"])
def test_loss_only_on_the_assistant_tokens(kind, chatml_tokenizer, tmp_path):
    tok = chatml_tokenizer if kind == "template" else CharTokenizer.train(json.dumps(CHATS) + "<|_>\n")
    path = _write(tmp_path / "chats.jsonl", [{"messages": c} for c in CHATS])
    examples = read_chats(path, tok)
    src = ChatBatches(examples, block_size=256, batch_size=2, pad_id=0)
    (x, y), = src.eval_batches()
    assert x.shape == y.shape and x.shape[0] == 2
    for r, chat in enumerate(CHATS):
        replies = [m["content"] + "<|im_end|>\n" for m in chat if m["role"] == "assistant"]
        assert _learned_text(tok, x[r], y[r]) == replies
        n = len(examples[r])
        # Inputs are the whole rendered conversation; the targets are the inputs shifted by one, where kept.
        full = examples[r].ids
        assert torch.equal(x[r, : n - 1], full[:-1])
        kept = y[r] >= 0
        assert torch.equal(y[r][kept], full[1:][kept[: n - 1]])
        assert (y[r, n - 1 :] == -100).all()  # padding is never a target
    if kind == "template":
        text = tok.decode(examples[0].ids.tolist(), skip_special=False)
        assert text == "<s>" + render_chat(tok, CHATS[0], add_generation_prompt=False)  # <s> once, at the start
        assert (examples[0].ids == tok.bos_id).sum() == 1


def test_batches_are_a_pure_function_of_the_index(chatml_tokenizer, tmp_path):
    path = _write(tmp_path / "c.jsonl", [{"messages": c} for c in CHATS] * 3)
    a = ChatBatches(read_chats(path, chatml_tokenizer), 128, 4, seed=3)
    b = ChatBatches(read_chats(path, chatml_tokenizer), 128, 4, seed=3)
    for i in (0, 7, 7):
        assert all(torch.equal(u, v) for u, v in zip(a.batch(i), b.batch(i)))


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"c.jsonl:3: not a JSON object"),
    ('{"msgs": []}', r"c.jsonl:3: expected an object with a 'messages' list"),
    ('{"messages": []}', r"c.jsonl:3: 'messages' must be a non-empty list"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', r"c.jsonl:3: message 0 has role 'robot'"),
    ('{"messages": [{"role": "user", "content": 7}]}', r"c.jsonl:3: message 0 has no text 'content'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"c.jsonl:3: the conversation has no assistant message"),
])
def test_a_malformed_record_names_its_line(bad, message, chatml_tokenizer, tmp_path):
    path = _write(tmp_path / "c.jsonl", [{"messages": CHATS[0]}, "", bad])  # line 2 is blank
    with pytest.raises(DataError, match=message):
        read_chats(path, chatml_tokenizer)


def test_conversations_without_a_reply_in_the_window_are_refused(chatml_tokenizer, tmp_path):
    path = _write(tmp_path / "c.jsonl", [{"messages": CHATS[0]}])
    with pytest.raises(DataError, match="no conversation has an assistant token within the first 4 tokens"):
        ChatBatches(read_chats(path, chatml_tokenizer), block_size=4, batch_size=1)
