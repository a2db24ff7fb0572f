"""``tokennet export``: ONNX (run by onnxruntime) and torch.export programs equal PyTorch on two shapes."""

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.errors import TokennetError
from tokennet.interop.export import export_run
from tokennet.models import create_model
from tokennet.models.registry import config_from_dict, model_from_config, save_pretrained

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {
    "gpt": dict(name="gpt-micro", vocab_size=67, block_size=12, num_layers=1, num_heads=3, dim=24),
    "vit": dict(name="vit-micro", num_layers=1),
    "text-encoder": dict(family="text-encoder", vocab_size=31, max_len=12, dim=16, num_layers=1, num_heads=2),
    "seq2seq": dict(name="seq2seq-micro", vocab_size=23, dim=16, num_layers=1, num_heads=2, max_source_len=10,
                    max_target_len=8),
}


def saved(tmp_path, family):
    kw = dict(MODELS[family])
    torch.manual_seed(0)
    if "family" in kw:  # a family without presets
        model = model_from_config(config_from_dict(kw))
    else:
        model = create_model(kw.pop("name"), **kw)
    return tokennet.load(save_pretrained(model, tmp_path / family))


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("family", list(MODELS))
def test_export_matches_pytorch_on_two_shapes(tmp_path, family, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    run = saved(tmp_path, family)
    r = export_run(run, tmp_path / f"model.{fmt}", fmt)
    assert r.path.is_file() and len(r.max_diff) == 2
    assert max(r.max_diff.values()) <= 1e-4
    if fmt == "pt2":  # the program is usable on its own: another batch and length than the example's
        prog = torch.export.load(str(r.path)).module()
        if family == "gpt":
            x = torch.randint(67, (5, 7))
            assert torch.allclose(prog(x), run.model(x).logits, atol=1e-5)
    elif family == "gpt":  # the written files, loaded fresh: the .onnx and the weights file it names
        import onnxruntime as ort

        assert sorted(f.name for f in tmp_path.iterdir() if f.name.startswith("model.")) == sorted(
            f.name for f in r.files)  # nothing but what the result lists; no temporary directory left
        assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]
        sess = ort.InferenceSession(str(r.path), providers=["CPUExecutionProvider"])
        x = torch.randint(67, (5, 7))
        got = torch.from_numpy(sess.run(None, {"idx": x.numpy()})[0])
        assert torch.allclose(got, run.model(x).logits, atol=1e-4)


def test_unsupported_family_and_bad_output_are_one_line(tmp_path, capsys):
    torch.manual_seed(0)
    run_dir = save_pretrained(create_model("bahdanau-micro", vocab_size=20), tmp_path / "b")
    with pytest.raises(TokennetError, match="not supported"):
        export_run(tokennet.load(run_dir), tmp_path / "b.pt2", "pt2")
    gpt = saved(tmp_path, "gpt")
    assert main(["export", str(gpt.path), "--format", "pt2", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["export", str(gpt.path), "--format", "pt2", "--out", str(tmp_path / "m.pt2")]) == 0
    assert "idx → logits" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "gpt", "m.pt2"]  # no temporary files left


def test_a_file_over_the_tolerance_is_refused_and_not_written(tmp_path, capsys, monkeypatch):
    import tokennet.interop.export as export

    gpt = saved(tmp_path, "gpt")
    out = tmp_path / "m.pt2"
    run_file = export._run_exported
    monkeypatch.setattr(export, "_run_exported", lambda *a: run_file(*a) + 1e-3)  # an export that is off by 1e-3
    assert main(["export", str(gpt.path), "--format", "pt2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "differs from PyTorch's by 1.00e-03" in err and "nothing was written" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["export", str(gpt.path), "--format", "pt2", "--out", str(out), "--tolerance", "2e-3"]) == 0
    assert out.is_file()
    assert main(["export", str(gpt.path), "--format", "pt2", "--out", str(out), "--tolerance", "0"]) == 2
    assert "tolerance must be > 0" in capsys.readouterr().err


def _imported(tmp_path, family):
    """A tiny random Hugging Face model of every family tokennet imports, imported into a run."""
    transformers = pytest.importorskip("transformers")
    from tests.interop.conftest import randomize
    from tokennet.interop import import_checkpoint

    make = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=101, n_positions=24, n_embd=48, n_layer=2, n_head=3)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=32)),
        "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50, image_size=20,
            patch_size=4, num_labels=7)),
        "bert": lambda: transformers.BertModel(transformers.BertConfig(
            vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
            max_position_embeddings=20)),
    }
    torch.manual_seed(0)
    randomize(make[family](), std=0.5).save_pretrained(tmp_path / "hf")  # large weights: logits in the tens
    return tokennet.load(import_checkpoint(tmp_path / "hf", tmp_path / "run").path)


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "vit", "bert"])
def test_every_importable_family_exports_with_default_settings(tmp_path, family, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    run = _imported(tmp_path, family)
    r = export_run(run, tmp_path / f"model.{fmt}", fmt)  # no --tolerance: the default check passes
    assert r.path.is_file() and len(r.max_diff) == 2


def test_the_default_check_scales_with_the_outputs_and_still_refuses_a_real_mismatch(tmp_path, monkeypatch):
    import tokennet.interop.export as export

    run = saved(tmp_path, "gpt")
    with torch.no_grad():  # logits of magnitude ~30, like a deep pretrained model's
        run.model.lm_head.weight.mul_(300)
        scale = run.model(run.model.example_input(1)).logits.abs().max().item()
    assert scale > 10
    run_file = export._run_exported
    monkeypatch.setattr(export, "_run_exported", lambda *a: run_file(*a) * (1 + 1e-5))  # float32-sized rounding
    r = export_run(run, tmp_path / "a.pt2", "pt2")
    assert max(r.max_diff.values()) > 1e-4  # more than the old absolute limit, and accepted
    monkeypatch.setattr(export, "_run_exported", lambda *a: run_file(*a) + 0.01 * scale)  # a real mismatch
    with pytest.raises(TokennetError, match="differs from PyTorch's"):
        export_run(run, tmp_path / "b.pt2", "pt2")
    assert not (tmp_path / "b.pt2").exists()
