"""GPT-2 checkpoints on tokennet's GPT: logits, attention maps and greedy decoding equal transformers'."""

import pytest
import torch

import tokennet
from tokennet.interop import import_checkpoint
from tokennet.sampling import generate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt2(tmp_path, randomized, **kw):
    # Odd shapes: vocab 101 (not a multiple of 64), 3 heads of width 16, n_inner not 4·D.
    cfg = transformers.GPT2Config(vocab_size=101, n_positions=24, n_embd=48, n_layer=2, n_head=3, bos_token_id=0,
                                  eos_token_id=0, **kw)
    torch.manual_seed(0)
    hf = randomized(transformers.GPT2LMHeadModel(cfg))
    hf.save_pretrained(tmp_path / "hf")
    return hf, import_checkpoint(tmp_path / "hf", tmp_path / "run")


@pytest.mark.parametrize("kw", [{}, {"tie_word_embeddings": False, "n_inner": 70, "activation_function": "gelu"}],
                         ids=["tied-gelu_new", "untied-gelu-n_inner"])
def test_logits_equal_transformers(tmp_path, randomized, kw):
    hf, result = tiny_gpt2(tmp_path, randomized, **kw)
    run = tokennet.load(result.path)  # tokennet code alone from here on
    assert run.task.name == "language model" and run.model.config.tie_weights == kw.get("tie_word_embeddings", True)
    ids = torch.randint(101, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, ours = hf(ids).logits, run.model(ids).logits
    assert ours.shape == ref.shape == (3, 24, 101)
    assert (ours - ref).abs().max() <= 1e-5


def test_attention_maps_and_greedy_decoding_equal_transformers(tmp_path, randomized):
    hf, result = tiny_gpt2(tmp_path, randomized)
    hf.config._attn_implementation = "eager"  # so that transformers returns its attention weights
    model = tokennet.load(result.path).model
    ids = torch.randint(101, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids, output_attentions=True).attentions
        ours = model.attention_maps(ids)["self"]
    assert len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert a.shape == b.shape == (2, 3, 10, 10)
        assert (a - b).abs().max() <= 1e-6
    prompt = ids[:1, :4]
    with torch.no_grad():
        ref_ids = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0,
                              attention_mask=torch.ones_like(prompt))
        our_ids = generate(model, prompt, 12, temperature=0)
    assert our_ids.tolist() == ref_ids.tolist()


def test_the_run_directory_is_ordinary(tmp_path, randomized):
    _, result = tiny_gpt2(tmp_path, randomized)
    names = sorted(p.name for p in result.path.iterdir())
    assert names == ["config.json", "model.safetensors", "run.json"]
    run = tokennet.load(result.path)
    assert run.settings["converter"] == "gpt2/GPT2LMHeadModel"
    assert not list(tmp_path.glob(".run.import-*"))  # the temporary directory was renamed, not left behind
