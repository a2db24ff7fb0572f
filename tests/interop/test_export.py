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
