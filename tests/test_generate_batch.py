"""``run.generate([prompt, ...])``: prompts of different lengths decoded together by the serving engine, one text per
prompt; greedy texts equal the one-prompt calls; a single string keeps its behaviour and return type."""

from __future__ import annotations

import pytest
import torch

import tokennet
from tokennet.errors import RunError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["The capital of France is", "Attention", "Queries, keys and values: 1234 and the capital of Italy is",
           "is all you need"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.interop.conftest import randomize

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["The capital of France is Paris. Attention is all you need: queries, keys and values "
                             "1234567890. The capital of Italy is Rome."] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "</s>"])
    engine = bpe._tokenizer
    torch.manual_seed(0)
    hf = randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=engine.get_vocab_size(), hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=96, bos_token_id=0, eos_token_id=1)),
        std=0.5)
    d = tmp_path_factory.mktemp("batch")
    hf.save_pretrained(d / "hf")
    engine.save(str(d / "hf" / "tokenizer.json"))
    return tokennet.load(import_checkpoint(d / "hf", d / "run").path)


def test_greedy_batch_equals_each_prompt_alone(run):
    alone = [run.generate(p, 16, temperature=0) for p in PROMPTS]
    assert all(isinstance(t, str) for t in alone) and sum(map(bool, alone)) >= 3  # a random model may end a prompt
    # at once (here the first: its greedy first token is the end of text); the batch must end it the same way
    assert len({len(run.tokenizer.encode(p)) for p in PROMPTS}) == len(PROMPTS)  # every prompt its own length
    assert run.generate(PROMPTS, 16, temperature=0) == alone
    assert run.generate(PROMPTS, 16, temperature=0, max_batch=2) == alone  # two rows: the others wait their turn
    assert run.generate(tuple(PROMPTS[:1]), 16, temperature=0) == alone[:1]
    assert run.generate([], 16) == []


def test_sampled_texts_do_not_depend_on_the_rest_of_the_batch(run):
    a = run.generate([PROMPTS[0], PROMPTS[1]], 12, temperature=1.0, seed=3)
    b = run.generate([PROMPTS[2], PROMPTS[0]], 12, temperature=1.0, seed=3)
    assert a[0] == b[1]  # each prompt draws from its own generator seeded `seed`
    assert len(a) == 2 and all(isinstance(t, str) and t for t in a)


def test_bad_batches_are_one_line_errors(run):
    with pytest.raises(RunError, match="strings"):
        run.generate(["ok", 3], 4)
    with pytest.raises(RunError, match="no room"):
        run.generate(["ok"], run.model.config.block_size)
    with pytest.raises(RunError, match=">= 1"):
        run.generate(["ok"], 0)
