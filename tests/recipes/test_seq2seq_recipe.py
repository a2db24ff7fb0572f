"""Recipe `seq2seq` end to end on tiny settings: train (both architectures), eval, translate, bad input."""

import json

import pytest

import tokennet
from tokennet.cli import main
from tokennet.recipes import get_recipe, train
from tokennet.recipes.seq2seq import text_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "max_iters": 3, "eval_interval": 0,
        "warmup_iters": 1, "test_size": 12, "val_size": 6, "beam_size": 2, "progress": False}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "s2s"
    run_dir, metrics = train("seq2seq", out=out, sets=TINY, device="cpu")
    return run_dir, metrics


def test_train_writes_a_run_with_the_metrics(run):
    run_dir, metrics = run
    for f in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "run.json"):
        assert (run_dir / f).is_file()
    saved = json.loads((run_dir / "metrics.json").read_text())
    for k in ("exact_match", "bleu", "chrf", "exact_match_greedy", "val_exact_match"):
        assert k in saved and 0 <= saved[k] <= 100
    assert saved["arch"] == "transformer" and saved["test_size"] == 12


def test_bahdanau_trains_on_the_same_data(tmp_path):
    sets = {k: v for k, v in TINY.items() if k != "num_heads"} | {"arch": "bahdanau"}
    run_dir, metrics = train("seq2seq", out=tmp_path / "b", sets=sets, device="cpu")
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["family"] == "bahdanau" and cfg["dim"] == 32
    assert metrics["arch"] == "bahdanau" and "exact_match" in metrics


def test_a_transformer_setting_does_not_apply_to_the_gru_baseline(tmp_path, capsys):
    """The GRU baseline is built from the shared settings: a Transformer-only one is refused, not ignored."""
    assert main(["-q", "train", "seq2seq", "--out", str(tmp_path / "c"), "--set", "arch=bahdanau",
                 "num_heads=8"]) == 2
    err = capsys.readouterr().err
    assert "num_heads does not apply" in err and not (tmp_path / "c").exists()


def test_settings_include_arch():
    d = get_recipe("seq2seq").defaults()
    assert d["arch"] == "transformer" and d["norm"] == "post" and "beam_size" in d


def test_cli_eval_and_generate(run, capsys, tmp_path):
    run_dir, _ = run
    assert main(["eval", str(run_dir)]) == 0
    m = json.loads(capsys.readouterr().out)
    assert {"exact_match", "bleu", "chrf"} <= set(m)
    tsv = tmp_path / "d.tsv"
    tsv.write_text("3rd of March 1999\t1999-03-03\nMar 3, 99\t1999-03-03\n")
    assert main(["eval", str(run_dir), "--data", str(tsv)]) == 0
    assert json.loads(capsys.readouterr().out)["test_size"] == 2
    assert main(["generate", str(run_dir), "--prompt", "3rd of March 1999"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1  # one translation (untrained: any string)


def test_bad_input_is_an_error_or_a_stated_unk(run, capsys, tmp_path):
    run_dir, _ = run
    assert main(["generate", str(run_dir), "--prompt", "   "]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["generate", str(run_dir), "--prompt", "9" * 41]) == 2
    assert "longer than the model's maximum of 40" in capsys.readouterr().err
    assert main(["generate", str(run_dir), "--prompt", "3rd of Março 1999 ☃"]) == 0
    err = capsys.readouterr().err
    assert "<unk>" in err and "☃" in err and "ç" in err
    _, unknown = tokennet.load(run_dir).translate("Q 3 1999", beam_size=1, return_unknown=True)
    assert unknown == ["Q"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n")
    assert main(["eval", str(run_dir), "--data", str(bad)]) == 2
    assert main(["eval", str(run_dir), "--data", str(tmp_path / "missing.tsv")]) == 2
    assert main(["generate", str(run_dir), "--prompt", "1999/3/3", "--beam-size", "0"]) == 2
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "x.png")]) == 2
    assert "--image does not apply" in capsys.readouterr().err
    assert main(["-q", "train", "seq2seq", "--out", str(tmp_path / "x"), "--set", "arch=lstm"]) == 2
    assert "arch must be one of" in capsys.readouterr().err


def test_text_metrics():
    m = text_metrics(["1999-03-03", "2000-01-01"], ["1999-03-03", "2000-01-02"])
    assert m["exact_match"] == 50.0 and 0 < m["bleu"] < 100 and 0 < m["chrf"] < 100
    assert text_metrics(["1999-03-03"], ["1999-03-03"])["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError):
        text_metrics([], [])
