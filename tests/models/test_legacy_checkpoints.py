"""Run directories saved before Q/K/V were fused (separate q_proj/k_proj/v_proj) load and give the same logits.

The fixtures in tests/fixtures/legacy_qkv/ were written by tokennet at commit 99ce777 (the last one with
separate projections): tiny GPT (grouped-query heads), Seq2Seq and Captioner models with their logits on
``example_input(2)``, computed by that code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tokennet.models.registry import load_pretrained

FIXTURES = Path(__file__).parent.parent / "fixtures" / "legacy_qkv"


@pytest.mark.parametrize("name", ["gpt", "seq2seq", "captioner"])
def test_legacy_run_directory_loads_with_the_same_logits(name):
    directory = FIXTURES / name
    assert "k_proj.weight" in " ".join(load_file(directory / "model.safetensors"))  # really the old layout
    model = load_pretrained(directory).eval()
    names = [n for n, _ in model.named_parameters()]
    assert any(n.endswith("attn.qkv_proj.weight") for n in names)
    assert not any(n.endswith((".k_proj.weight", ".v_proj.weight")) for n in names)
    with torch.no_grad():
        logits = model(model.example_input(2)).logits
    torch.testing.assert_close(logits, load_file(directory / "expected_logits.safetensors")["logits"])
