"""Starting weights: a run or an importable checkpoint gives model + tokenizer; anything else is one line."""

import pytest
import torch
from support import assert_same_function

from tokennet.errors import RunError
from tokennet.interop import convert
from tokennet.interop.init import check_resume_vocabulary, load_init, with_num_classes
from tokennet.models import create_model, save_pretrained
from tokennet.run import save_tokenizer, write_run_info
from tokennet.tokens.text import CharTokenizer

transformers = pytest.importorskip("transformers")


def _run(path, text="hello world", seed=0):
    tok = CharTokenizer.train(text)
    torch.manual_seed(seed)
    m = create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=16)
    save_pretrained(m, path)
    save_tokenizer(path, tok)
    write_run_info(path, recipe="gpt-char", model="gpt-micro", data=None, settings={})
    return m, tok


def test_a_run_directory(tmp_path):
    m, tok = _run(tmp_path / "run")
    init = load_init(tmp_path / "run")
    assert init.kind == "run" and init.tokenizer.to_dict() == tok.to_dict()
    assert init.model.training and all(p.requires_grad for p in init.model.parameters())
    for k, v in m.state_dict().items():
        assert torch.equal(init.model.state_dict()[k], v), k


def test_a_hugging_face_directory_is_converted_in_memory(tmp_path, randomized):
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    d = tmp_path / "llama"
    randomized(transformers.LlamaForCausalLM(cfg)).save_pretrained(d)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    init = load_init(d)
    assert init.kind == "llama/LlamaForCausalLM"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
    ref, _, _, _ = convert(d)
    x = torch.randint(50, (1, 8))
    init.model.eval()
    assert_same_function(init.model(x).logits, ref(x).logits)  # two loads of one checkpoint: float32 round-off


@pytest.mark.parametrize("what", ["missing", "empty_dir", "text_file", "run_without_weights"])
def test_neither_a_run_nor_importable_is_one_line(what, tmp_path):
    p = tmp_path / "x"
    if what == "empty_dir":
        p.mkdir()
    elif what == "text_file":
        p.write_text("not a checkpoint")
    elif what == "run_without_weights":
        _run(p)
        (p / "model.safetensors").unlink()
    with pytest.raises(RunError) as e:
        load_init(p)
    assert "\n" not in str(e.value)
    assert {"missing": "do not exist", "empty_dir": "is neither a tokennet run", "text_file": "is neither",
            "run_without_weights": "without weights"}[what] in str(e.value)


def test_resume_refuses_another_vocabulary(tmp_path):
    _run(tmp_path / "base", "abc")
    _run(tmp_path / "resumed", "abc")
    check_resume_vocabulary(load_init(tmp_path / "base"), tmp_path / "resumed")  # same vocabulary: fine
    _run(tmp_path / "other", "abcdefg")
    with pytest.raises(RunError, match=r"\(11 tokens\) differs from the run .* being resumed \(7 tokens\)"):
        check_resume_vocabulary(load_init(tmp_path / "other"), tmp_path / "resumed")
    _run(tmp_path / "same_size", "xyz")  # as many tokens, other characters
    with pytest.raises(RunError, match="differs"):
        check_resume_vocabulary(load_init(tmp_path / "same_size"), tmp_path / "resumed")


def test_a_classifier_gets_a_new_head_for_other_classes():
    torch.manual_seed(0)
    m = create_model("vit-micro", num_classes=10)
    new, fresh = with_num_classes(m, 3)
    assert new.config.num_classes == 3 and fresh and all(k.startswith("head.") for k in fresh)
    old = m.state_dict()
    for k, v in new.state_dict().items():
        if k not in fresh:
            assert torch.equal(v, old[k]), k
    assert new(torch.randn(2, 3, 16, 16)).logits.shape == (2, 3)
    assert with_num_classes(m, 10) == (m, [])
