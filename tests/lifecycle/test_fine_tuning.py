"""Fine-tuning through the CLI: ``tokennet train RECIPE --init SOURCE`` (full or LoRA), chat data, and its errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tokennet.cli import main
from tokennet.interop.init import load_init, with_num_classes
from tokennet.layers.lora import load_adapter, lora_layers, merge_lora
from tokennet.models.registry import load_pretrained, save_pretrained
from tokennet.run import load

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["block_size=32", "batch_size=16", "eval_iters=4", "sample_tokens=0", "eval_interval=0", "report=false"]


def _train(*argv) -> int:
    return main(["-q", "train", *map(str, argv)])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A base GPT (byte-level BPE) trained on one kind of line; text of another kind; a chat file."""
    root = tmp_path_factory.mktemp("finetune")
    (root / "a.txt").write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                                        for i in range(400)))
    (root / "b.txt").write_text("".join(f"row {i}: a lazy dog sleeps under the quick brown fox.\n" for i in range(400)))
    chats = [{"messages": [{"role": "user", "content": f"what is {i} plus one?"},
                           {"role": "assistant", "content": f"{i + 1}"}]} for i in range(40)]
    (root / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    assert _train("gpt", "--data", root / "a.txt", "--out", root / "base", "--max-iters", 150, "--set", "dim=32",
                  "num_layers=2", "num_heads=2", "vocab_size=300", *SMALL, "block_size=96") == 0
    return root


def _eval(run, *extra, capsys) -> dict:
    capsys.readouterr()
    assert main(["-q", "eval", str(run), *map(str, extra)]) == 0
    return json.loads(capsys.readouterr().out)


def test_lora_learns_a_held_out_shift_and_saves_merged_weights_and_the_adapter(world, tmp_path, capsys):
    before = _eval(world / "base", "--data", world / "b.txt", capsys=capsys)["val_loss"]
    out = tmp_path / "lora"
    assert _train("gpt", "--init", world / "base", "--data", world / "b.txt", "--out", out, "--max-iters", 60,
                  "--set", *SMALL, "lora_rank=4", "lora_alpha=8", "lora_save=adapter", "lr=3e-3") == 0
    after = json.loads((out / "metrics.json").read_text())["val_loss"]
    assert after < 0.8 * before, (before, after)  # the shifted text is learnt through the adapters alone
    assert _eval(out, capsys=capsys)["val_loss"] == pytest.approx(after, rel=1e-6)
    assert json.loads((out / "run.json").read_text())["init"] == str(world / "base")
    # The run holds W + (α/r)·B·A; the adapter file holds B, A and refuses another base.
    adapted = load_pretrained(world / "base")
    config = load_adapter(adapted, out / "adapter.safetensors")
    assert (config.rank, config.alpha) == (4, 8.0)
    merged = load_file(str(out / "model.safetensors"))
    layers = lora_layers(adapted)
    assert layers
    for name, layer in layers.items():
        want = layer.weight + layer.delta_weight()
        torch.testing.assert_close(merged[f"{name}.weight"], want.detach(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="base"):
        load_adapter(load_pretrained(out), out / "adapter.safetensors")  # the merged run is another base


def test_a_lora_run_under_bf16_autocast_learns_and_its_metric_is_recomputed(world, tmp_path, capsys):
    """``precision=bf16`` with the fused LoRA layers (they once failed under autocast)."""
    before = _eval(world / "base", "--data", world / "b.txt", capsys=capsys)["val_loss"]
    out = tmp_path / "lora-bf16"
    assert _train("gpt", "--init", world / "base", "--data", world / "b.txt", "--out", out, "--max-iters", 60,
                  "--set", *SMALL, "lora_rank=4", "lora_alpha=8", "lr=3e-3", "precision=bf16") == 0
    after = json.loads((out / "metrics.json").read_text())["val_loss"]
    assert after < 0.8 * before, (before, after)
    assert _eval(out, capsys=capsys)["val_loss"] == pytest.approx(after, rel=1e-6)


def test_a_lora_run_resumes_bitwise(world, tmp_path):
    sets = [*SMALL, "lora_rank=4", "lora_dropout=0.1", "checkpoint_interval=4"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train("gpt", "--init", world / "base", "--data", world / "b.txt", "--out", a, "--max-iters", 8,
                  "--set", *sets) == 0
    assert _train("gpt", "--init", world / "base", "--data", world / "b.txt", "--out", b, "--max-iters", 4,
                  "--set", *sets) == 0
    assert _train("gpt", "--out", b, "--resume", "--max-iters", 8) == 0
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_chat_data_trains_on_the_replies_and_eval_recomputes_it(world, tmp_path, capsys):
    out = tmp_path / "chat"
    assert _train("gpt", "--init", world / "base", "--data", world / "chats.jsonl", "--out", out, "--max-iters", 20,
                  "--set", *SMALL, "block_size=96") == 0
    m = json.loads((out / "metrics.json").read_text())
    spec = json.loads((out / "run.json").read_text())["data_spec"]
    assert spec["kind"] == "chats" and m["val_loss"] > 0
    assert _eval(out, capsys=capsys)["val_loss"] == pytest.approx(m["val_loss"], rel=1e-6)


def test_a_run_fine_tuned_on_chats_has_its_report(world, tmp_path, capsys):
    """Found by the tutorials' test: the report's surprise panel asked the chat data for a token stream."""
    out = tmp_path / "chat-report"
    assert _train("gpt", "--init", world / "base", "--data", world / "chats.jsonl", "--out", out, "--max-iters", 2,
                  "--set", *SMALL, "block_size=96", "report=true") == 0
    assert "could not write" not in capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert "nats" in page  # the per-token loss of the validation conversations


def test_fine_tuning_errors_are_one_line_and_write_nothing(world, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    other = tmp_path / "other"
    assert _train("gpt", "--data", world / "a.txt", "--out", other, "--max-iters", 1, "--set", "dim=32",
                  "num_layers=1", "num_heads=2", "vocab_size=280", *SMALL) == 0
    out = tmp_path / "x"
    cases = [
        (["gpt", "--init", tmp_path / "nowhere"], "do not exist"),
        (["gpt", "--init", world / "a.txt"], "neither a tokennet run"),
        (["gpt", "--init", world / "base", "--set", "lora_rank=4", "lora_targets=nothing"], "names no linear layer"),
        (["gpt", "--init", world / "base", "--set", "lora_rank=4096"], "rank"),
        (["gpt", "--init", world / "base", "--data", tmp_path / "bad.jsonl"], "bad.jsonl:1"),
        (["gpt", "--init", world / "base", "--set", "dim=64"], "does not apply with --init"),
        (["gpt", "--data", world / "a.txt", "--set", "lora_rank=4"], "give --init"),
        (["gpt", "--init", world / "base", "--set", "lora_alpha=4"], "set lora_rank"),
        (["gpt", "--init", world / "base", "--set", "lora_modules_to_save=lm_head"], "set lora_rank"),
        (["gpt", "--init", world / "base", "--data", world / "b.txt", "--set", "lora_rank=4",
          "lora_modules_to_save=lm_head"], "shares a parameter with"),  # tied to the embedding
        (["caption", "--init", world / "base"], "cannot start from --init"),
    ]
    for argv, fragment in cases:
        capsys.readouterr()
        assert _train(*argv, "--out", out, "--max-iters", 2) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("tokennet: error:") and "\n" not in err and fragment in err, (argv, err)
        assert not out.exists(), argv
    # Resuming a fine-tuned run from weights whose vocabulary is not the run's.
    run = tmp_path / "ft"
    assert _train("gpt", "--init", world / "base", "--data", world / "b.txt", "--out", run, "--max-iters", 2,
                  "--set", *SMALL) == 0
    info = json.loads((run / "run.json").read_text())
    info["init"] = str(other)
    (run / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    assert _train("gpt", "--out", run, "--resume", "--max-iters", 4) == 2
    assert "vocabulary" in capsys.readouterr().err


def test_lora_from_a_quantized_gguf_file_but_not_from_a_run_holding_blocks(world, tmp_path, capsys):
    """--init FILE.gguf with Q8_0 tensors trains (they are dequantized to float32 for training); a run that holds
    GGUF blocks (tokennet import of that file) is refused in one line, nothing written."""
    gguf = tmp_path / "base.gguf"
    assert main(["-q", "export", str(world / "base"), "--format", "gguf", "--gguf-type", "q8_0",
                 "--out", str(gguf)]) == 0
    assert _train("gpt", "--data", world / "b.txt", "--out", tmp_path / "ft", "--init", gguf, "--max-iters", 5,
                  "--set", "lora_rank=4", *SMALL) == 0
    assert (tmp_path / "ft" / "model.safetensors").is_file()
    assert main(["-q", "import", str(gguf), "--out", str(tmp_path / "imported")]) == 0
    capsys.readouterr()
    assert _train("gpt", "--data", world / "b.txt", "--out", tmp_path / "ft2", "--init", tmp_path / "imported",
                  "--max-iters", 5, "--set", "lora_rank=4", *SMALL) == 2
    err = capsys.readouterr().err
    assert "GGUF blocks" in err and err.strip().count("\n") == 0 and not (tmp_path / "ft2").exists()


# -- LoRA on a classifier whose data has other classes: the new head trains in full ---------------------------
VIT = ["batch_size=32", "svm_baseline=false", "eval_interval=0", "report=false", "time_budget=none"]


@pytest.fixture(scope="module")
def vit_init(tmp_path_factory):
    """A ViT trained on digits (10 classes), saved as a 4-class model: fine-tuning on digits gives it a new head."""
    root = tmp_path_factory.mktemp("vit_init")
    assert _train("vit", "--out", root / "base", "--max-iters", 600, "--set", *VIT, "dim=32", "num_layers=1",
                  "num_heads=2") == 0
    torch.manual_seed(5)
    four, _ = with_num_classes(load(root / "base").model, 4)
    save_pretrained(four, root / "init4")
    return root / "init4"


def _fresh_head(init, seed=0):
    """The head the recipe creates for digits' 10 classes from ``init`` (seeded with the run's seed, as ``build``)."""
    model = load_init(init).model
    torch.manual_seed(seed)
    return with_num_classes(model, 10)[0]


def test_vit_lora_on_new_classes_trains_the_new_head_and_saves_it_with_the_adapter(vit_init, tmp_path):
    out = tmp_path / "ft"
    assert _train("vit", "--init", vit_init, "--out", out, "--max-iters", 100, "--set", *VIT, "lora_rank=4",
                  "lora_save=adapter") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    # Adapters against the frozen random head (before heads trained in full): test loss 1.90, accuracy 74.1%.
    assert metrics["test_loss"] < 1.3, metrics
    merged = load_file(str(out / "model.safetensors"))
    fresh = _fresh_head(vit_init)
    assert not torch.equal(merged["head.fc.weight"], fresh.head.fc.weight)  # the head trained
    saved = load_file(str(out / "adapter.safetensors"))
    assert torch.equal(saved["head.fc.weight"], merged["head.fc.weight"])
    assert torch.equal(saved["head.fc.bias"], merged["head.fc.bias"])
    # The base stayed frozen: every tensor that is neither adapted nor the head is the --init model's.
    base = load_pretrained(vit_init).state_dict()
    adapted = {f"{n}.weight" for n in {k.rsplit(".", 1)[0] for k in saved if k.endswith("lora_A")}}
    assert adapted
    for k, v in base.items():
        if k not in adapted and not k.startswith("head.fc."):
            assert torch.equal(merged[k], v), k
    # The adapter file on the base with any new head (another seed's) is the run: the same outputs.
    other = _fresh_head(vit_init, seed=7)
    load_adapter(other, out / "adapter.safetensors")
    x = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    want = load(out).model.eval()(x).logits
    torch.testing.assert_close(merge_lora(other).eval()(x).logits, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="base"):
        load_adapter(load_pretrained(out), out / "adapter.safetensors")  # the merged run is another base


def test_a_vit_lora_run_with_a_new_head_resumes_bitwise(vit_init, tmp_path):
    sets = [*VIT, "lora_rank=4", "lora_dropout=0.1", "checkpoint_interval=4", "lora_save=adapter",
            "lora_modules_to_save=head"]  # the whole head (its norm too), which holds the new head.fc
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train("vit", "--init", vit_init, "--out", a, "--max-iters", 8, "--set", *sets) == 0
    assert _train("vit", "--init", vit_init, "--out", b, "--max-iters", 4, "--set", *sets) == 0
    assert _train("vit", "--out", b, "--resume", "--max-iters", 8) == 0
    for f in ("model.safetensors", "adapter.safetensors"):
        wa, wb = load_file(str(a / f)), load_file(str(b / f))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f
    saved = load_file(str(a / "adapter.safetensors"))
    assert {"head.norm.weight", "head.fc.weight"} <= set(saved)
    assert not torch.equal(saved["head.fc.weight"], _fresh_head(vit_init).head.fc.weight)
