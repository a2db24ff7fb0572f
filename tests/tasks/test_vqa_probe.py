"""``tokennet probe``: the cut masks hide exactly an animal's own patches (own) or its species' (alike); under the cut
a patch's token after one block does not depend on the hidden patches' pixels; the probe separates what is
separable and not what is not; a tiny trained vqa run probed through the CLI; bad input in one line."""

import json

import pytest
import torch

from tokennet.cli import main
from tokennet.linear_probe import linear_probe
from tokennet.models.vqa import VQATransformer, VQATransformerConfig
from tokennet.recipes import train
from tokennet.tasks.vqa_probe import ProbePictures, cut_mask, depth_tokens, probe_pictures

pytestmark = pytest.mark.usefixtures("one_thread")

VQA = {"dim": 32, "num_layers": 2, "num_heads": 2, "batch_size": 16, "max_iters": 20, "eval_interval": 0,
       "warmup_iters": 1, "test_size": 20, "unseen_size": 4, "val_size": 8, "progress": False, "baselines": False,
       "grouping": False, "report": False, "patch_size": 8}


def _model(num_layers: int = 1) -> VQATransformer:
    torch.manual_seed(0)
    config = VQATransformerConfig(image_size=32, patch_size=8, vocab_size=12, num_answers=5, dim=16, num_heads=2,
                                  num_layers=num_layers, max_question_len=4)
    return VQATransformer(config).eval()


def _pictures(images: torch.Tensor) -> ProbePictures:
    """Two animals of species 0 (patches {0, 1} and {5}) and one of species 1 (patches {10, 11}) in every picture."""
    return ProbePictures(images, ["q"] * len(images), [[(0, [0, 1]), (0, [5]), (1, [10, 11])]] * len(images))


def test_own_hides_an_animals_other_patches_and_alike_its_species_patches_only():
    model = _model()
    n_text = model.config.num_text
    pictures = _pictures(torch.rand(1, 3, 32, 32))
    own, alike = cut_mask(model.config, pictures, "own")[0, 0], cut_mask(model.config, pictures, "alike")[0, 0]
    assert cut_mask(model.config, pictures, "none") is None

    def hidden(mask, patch):
        return {key - n_text for key in (~mask[n_text + patch]).nonzero().flatten().tolist()}

    assert hidden(own, 0) == {1} and hidden(own, 5) == set() and hidden(own, 10) == {11}
    assert hidden(alike, 0) == {1, 5} and hidden(alike, 5) == {0, 1} and hidden(alike, 11) == {10}
    assert hidden(own, 3) == set() and not (~own[:n_text]).any()  # other patches and the question's tokens: untouched


def test_under_the_cut_a_patch_after_one_block_ignores_the_hidden_patches_pixels():
    model = _model(num_layers=1)
    images = torch.rand(2, 3, 32, 32)
    changed = images.clone()
    changed[:, :, 0:8, 8:16] = torch.rand(2, 3, 8, 8)  # patch 1: patch 0's own animal
    pictures = _pictures(images)
    questions = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    n_text = model.config.num_text
    mask = cut_mask(model.config, pictures, "own")
    cut_before, cut_after = (depth_tokens(model, x, questions, mask)[1][:, n_text + 0] for x in (images, changed))
    torch.testing.assert_close(cut_before, cut_after, atol=1e-6, rtol=0)
    seen_before, seen_after = (depth_tokens(model, x, questions)[1][:, n_text + 0] for x in (images, changed))
    assert (seen_before - seen_after).abs().max() > 1e-4  # as trained, patch 0 does see patch 1
    assert len(depth_tokens(model, images, questions)) == model.config.num_layers + 1


def test_the_probe_names_separable_classes_and_is_at_chance_on_noise():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (600,), generator=generator)
    centres = torch.randn(3, 8, generator=generator) * 3
    features = centres[labels] + torch.randn(600, 8, generator=generator)
    assert linear_probe(features[:400], labels[:400], features[400:], labels[400:], 3) > 95
    noise = torch.randn(600, 8, generator=generator)
    assert linear_probe(noise[:400], labels[:400], noise[400:], labels[400:], 3) < 50


def test_probe_pictures_label_every_animal_with_its_patches():
    pictures = probe_pictures(12, seed=0, clutter=6, grid=(8, 8), patch_size=8)
    assert pictures.images.shape == (12, 3, 64, 64) and len(pictures.questions) == 12
    counts = [len(patches) for animals in pictures.animals for _, patches in animals]
    assert min(counts) >= 1 and max(counts) <= 4 and sum(counts) / len(counts) > 1.5  # 8-px patches: several each
    again = probe_pictures(12, seed=0, clutter=6, grid=(8, 8), patch_size=8)
    assert torch.equal(pictures.images, again.images) and pictures.animals == again.animals


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    out, _ = train("vqa", out=tmp_path_factory.mktemp("runs") / "vqa", sets=VQA, device="cpu")
    return out


def test_the_cli_prints_a_table_per_depth_and_json(vqa_run, capsys):
    assert main(["probe", str(vqa_run), "--pictures", "40", "--cut", "none", "--cut", "own"]) == 0
    table = capsys.readouterr().out
    assert "as trained" in table and "own patches cut" in table and "after block 1" in table
    assert main(["probe", str(vqa_run), "--pictures", "40", "--cut", "alike", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["alike"]) == result["depths"] == 3 and "none" not in result
    assert all(0 <= value <= 100 for value in result["alike"]) and result["patches_per_animal"] > 1


def test_bad_settings_are_one_line_and_exit_2(vqa_run, capsys):
    assert main(["probe", str(vqa_run), "--pictures", "3"]) == 2
    err = capsys.readouterr().err
    assert "--pictures must be in 10..100000" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["probe", str(vqa_run), "--cut", "bogus"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_run_without_animals_is_refused_in_one_line(tmp_path, capsys):
    sets = {"widths": [8, 16], "depths": [1, 1], "batch_size": 32, "max_iters": 2, "eval_interval": 0,
            "progress": False, "report": False}
    out, _ = train("cnn", out=tmp_path / "cnn", sets=sets, device="cpu")
    before = sorted(p.name for p in out.iterdir())
    assert main(["probe", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a question-answering run on tokennet's generated animal scenes" in err
    assert sorted(p.name for p in out.iterdir()) == before
