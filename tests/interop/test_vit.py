"""Hugging Face ViT classifiers on tokennet's ViT: logits and attention maps equal transformers'."""

import pytest
import torch

import tokennet
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_logits_and_attention_equal_transformers(tmp_path, randomized):
    cfg = transformers.ViTConfig(hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
                                 image_size=20, patch_size=4, num_channels=3, num_labels=7,
                                 attn_implementation="eager")
    torch.manual_seed(0)
    hf = randomized(transformers.ViTForImageClassification(cfg))
    hf.save_pretrained(tmp_path / "hf")
    result = import_checkpoint(tmp_path / "hf", tmp_path / "run")
    run = tokennet.load(result.path)
    assert run.task.kind == "image-classification" or run.task.name == "image classification"
    assert run.model.config.norm_eps == 1e-12
    x = torch.randn(3, 3, 20, 20, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = hf(x, output_attentions=True)
        ours = run.model(x).logits
        maps = run.model.attention_maps(x)["self"]
    assert ours.shape == out.logits.shape == (3, 7)
    assert out.logits.std() > 0.1  # the comparison is not between two constants
    assert (ours - out.logits).abs().max() <= 1e-5
    for a, b in zip(maps, out.attentions):
        assert a.shape == b.shape == (3, 3, 26, 26)
        assert (a - b).abs().max() <= 1e-6
