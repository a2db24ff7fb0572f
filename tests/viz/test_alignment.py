"""Alignment heatmaps and caption attention: the weights behind them, the PNGs, `tokennet viz`."""

import pytest
import torch

from tokennet.cli import main
from tokennet.models import create_model
from tokennet.recipes import train
from tokennet.viz import list_viz
from tokennet.viz.alignment import alignments, plot_alignment, plot_caption_attention

pytestmark = pytest.mark.usefixtures("one_thread")


PNG = b"\x89PNG"


@pytest.mark.parametrize("name", ["seq2seq-micro", "bahdanau-micro", "captioner-micro", "captioner-prefix-micro"])
def test_alignments_are_distributions_over_the_source(name):
    torch.manual_seed(0)
    m = create_model(name)
    x, tgt = m.example_input(2)
    a = alignments(m, x, tgt)  # (L, B, H, T, S)
    S = m.config.num_patches if "captioner" in name else x.shape[1]
    assert a.shape[1] == 2 and a.shape[3] == tgt.shape[1] and a.shape[4] == S
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    if name.startswith(("seq2seq", "bahdanau")):
        assert (a[:, 1, ..., x.shape[1] - 1] == 0).all()  # row 1 ends in padding: never attended
    assert m.training  # evaluated in eval mode, then put back in the mode it was in


def test_plots_write_pngs(tmp_path):
    p = plot_alignment(torch.rand(2, 3, 4, 5).softmax(-1), list("abcde"), list("wxyz"), tmp_path / "a.png",
                       title="t")
    assert p.read_bytes()[:4] == PNG
    img = torch.rand(3, 16, 16)
    p = plot_caption_attention(img, torch.rand(3, 16).softmax(-1), ["a", "red", "<eos>"], (4, 4), tmp_path / "c.png")
    assert p.read_bytes()[:4] == PNG
    with pytest.raises(ValueError, match="labels"):
        plot_alignment(torch.rand(1, 1, 4, 5), list("abc"), list("wxyz"), tmp_path / "b.png")


def test_every_conditional_family_has_pictures_through_its_task():
    from tokennet.tasks import task_for

    for family in ("seq2seq", "bahdanau", "captioner", "captioner-prefix"):
        assert task_for(family).kind in set(list_viz())


TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 4, "max_iters": 1, "eval_interval": 0,
        "warmup_iters": 0, "test_size": 4, "val_size": 2, "progress": False}


def test_tokennet_viz_for_translation_and_captions(tmp_path, capsys):
    s2s, _ = train("seq2seq", out=tmp_path / "s2s", sets={**TINY, "beam_size": 1}, device="cpu")
    assert main(["viz", str(s2s), "--index", "1"]) == 0
    assert (s2s / "viz" / "alignment.png").read_bytes()[:4] == PNG
    assert main(["viz", str(s2s), "--text", "3rd of March 1999", "--layer", "0", "--head", "1",
                 "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "alignment-3rd-of-march-1999.png").is_file()  # the text's own name: no overwrite
    assert not (tmp_path / "v" / "alignment.png").exists()
    assert main(["viz", str(s2s), "--layer", "5"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["viz", str(s2s), "--index", "99"]) == 2
    cap, _ = train("caption", out=tmp_path / "cap", sets={**TINY, "form": "decoder-only"}, device="cpu")
    assert main(["viz", str(cap), "--index", "2"]) == 0
    assert (cap / "viz" / "caption_attention.png").read_bytes()[:4] == PNG
