"""The vqa measurements held to fake models whose attention is known: attention that follows the question
against the other animals, the sink's weight against 1/(k+1), patches that group by animal; and the configs
and sweep settings that are refused in one line."""

from pathlib import Path

import pytest
import torch
from support import load_bench

from tokennet.data.vqa import AnimalQuestions
from tokennet.errors import TokennetError
from tokennet.models.vqa import VQATransformerConfig
from tokennet.tasks.vqa import attention_vs_others, counted_mass, fit_rest, object_patches, patch_grouping, sink_weights

pytestmark = pytest.mark.usefixtures("one_thread")


class Fake(torch.nn.Module):
    """A one-layer model whose attention rows are written by ``fill(a, i, c)`` for the question ``i`` of ``qa``
    (found by its image and its question)."""

    def __init__(self, qa, fill, patch_size=16, heads=1):
        super().__init__()
        self.config = VQATransformerConfig(vocab_size=40, max_question_len=16, patch_size=patch_size)
        self.qa, self.fill, self.heads = qa, fill, heads
        self.w = torch.nn.Parameter(torch.zeros(1))

    def attention_maps(self, inputs):
        images, _ = inputs
        c = self.config
        L = c.num_text + c.num_patches
        a = torch.zeros(len(images), self.heads, L, L)
        seen = set()
        for b, x in enumerate(images):
            i = next(j for j in range(len(self.qa)) if j not in seen and torch.equal(self.qa.images[j], x))
            seen.add(i)
            self.fill(a[b], i, c)
        return {"self": [a]}


@pytest.fixture(scope="module")
def qa():
    return AnimalQuestions(test_size=60).filled().held_out()


def _spread(a, patches, c, row=0):
    a[:, row, :] = 0
    a[:, row, [c.num_text + p for p in patches]] = 1 / len(patches)


def test_attention_that_follows_the_question_beats_the_other_animals_and_a_blind_one_does_not(qa):
    words = AnimalQuestions().filled().words

    def asked(a, i, c):
        _spread(a, object_patches(qa.boxes[i], c.grid, c.patch_size) if qa.boxes[i] else [0], c)

    def blind(a, i, c):  # every animal alike, whatever was asked
        _spread(a, object_patches(qa.boxes[i] + qa.other_boxes[i], c.grid, c.patch_size), c)

    good = attention_vs_others(Fake(qa, asked), qa, words)
    bad = attention_vs_others(Fake(qa, blind), qa, words)
    assert good["attention_vs_other_animals"] > 100  # nothing on the others (up to the clamp)
    assert bad["attention_vs_other_animals"] == pytest.approx(1.0, abs=1e-3)
    assert bad["attention_vs_other_animals_same_species"] == pytest.approx(1.0, abs=1e-3)
    assert good["attention_image_share"] == pytest.approx(1.0)  # the whole row is on patches
    # Half the row on the sink: half the question's attention reaches the image.
    def half(a, i, c):
        blind(a, i, c)
        a[:, 0] /= 2
        a[:, 0, 1] = 0.5

    assert attention_vs_others(Fake(qa, half), qa, words)["attention_image_share"] == pytest.approx(0.5)


def test_a_hand_built_counter_puts_one_over_k_plus_one_on_the_sink(qa):
    words = AnimalQuestions().filled().words

    def counter(a, i, c):
        p = object_patches(qa.boxes[i], c.grid, c.patch_size) if qa.boxes[i] else []
        a[0, 0, :] = 0
        a[0, 0, 1] = 1 / (len(p) + 1)
        for q in p:
            a[0, 0, c.num_text + q] = 1 / (len(p) + 1)
        a[1, 0, 1] = 0.3  # head 1: a constant on the sink

    sw = sink_weights(Fake(qa, counter, heads=2), qa, words)
    assert sw["best"] == "0.0" and sw["heads"]["0.0"]["r"] == pytest.approx(1.0, abs=1e-4)
    for k, w in sw["heads"]["0.0"]["by_k"].items():
        assert w == pytest.approx(1 / (k + 1), abs=1e-4)
    assert sw["heads"]["0.1"]["r"] == 0.0


@pytest.mark.parametrize("rest", [1.0, 6.0])
def test_counted_mass_finds_how_many_animals_worth_of_weight_rests_elsewhere(qa, rest):
    """Equal weight on each counted animal and ``rest`` animals' worth on the words (``rest=1``: the hand-built
    counter's sink): the weight on the counted animals is ``k / (k + rest)``, and the fit finds ``rest``."""
    words = AnimalQuestions().filled().words

    def counter(a, i, c):
        p = object_patches(qa.boxes[i], c.grid, c.patch_size) if qa.boxes[i] else []
        a[0, 0, :] = 0
        for q in p:
            a[0, 0, c.num_text + q] = 1 / (len(p) + rest)
        a[0, 0, 2:c.num_text] = rest / (len(p) + rest) / (c.num_text - 2)  # the rest on the word slots

    cm = counted_mass(Fake(qa, counter), qa, words)
    got = cm["layers"][0]
    assert cm["best"] == 0 and got["c"] == pytest.approx(rest, rel=1e-3) and got["gap"] < 1e-3
    assert got["r"] == pytest.approx(1.0, abs=1e-4) and min(cm["k"]) >= 1
    for k, w in got["by_k"].items():
        assert w == pytest.approx(k / (k + rest), abs=1e-4)

    def blind(a, i, c):  # every patch alike: the counted animals get their share of the picture, k/16
        a[0, 0, :] = 0
        a[0, 0, c.num_text:] = 1 / c.num_patches

    flat = counted_mass(Fake(qa, blind), qa, words)["layers"][0]
    assert flat["by_k"][1] == pytest.approx(1 / 16, abs=1e-4)
    assert fit_rest([1, 2, 4], [1 / 3, 1 / 2, 2 / 3]) == pytest.approx((2.0, 0.0), abs=2e-3)


def test_patches_of_one_animal_that_attend_to_each_other_group_far_above_their_share(qa):
    words = AnimalQuestions().filled().words

    def grouped(a, i, c):
        n = c.num_text
        a[0, n:, n:] = 1.0  # everything alike ...
        for b in qa.boxes[i] + qa.other_boxes[i]:
            p = object_patches([b], c.grid, c.patch_size)
            for s in p:
                a[0, n + s, [n + q for q in p]] = 50.0  # ... but an animal's patches 50× more on each other

    def uniform(a, i, c):
        a[0, c.num_text:, c.num_text:] = 1.0

    g = patch_grouping(Fake(qa, grouped, patch_size=8), qa, words, limit=20)
    u = patch_grouping(Fake(qa, uniform, patch_size=8), qa, words, limit=20)
    assert g["patch_grouping_ratio"] > 10 and u["patch_grouping_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert patch_grouping(Fake(qa, uniform), qa, words, limit=20) == {}  # 16-px patches: one per animal


def test_patches_that_never_meet_cannot_group_and_untrained_ones_are_blind_to_objects():
    """The recipe's note on ``patch_grouping_ratio``: under ``modality_mask="patch-local"`` a patch attends only to
    its own tokens, so the ratio is 0 in every layer; with image-first an untrained model's patches look at every
    other patch alike after layer 0 (ratio ≈ 1)."""
    from tokennet.models.registry import create_model

    spec = AnimalQuestions(test_size=40).filled()
    qa = spec.held_out()
    kw = dict(patch_stem="shape,colour", patch_size=8, vocab_size=len(spec.words) + 1, max_question_len=12,
              num_answers=len(spec.answers), dim=32, num_heads=2)
    torch.manual_seed(0)
    local = patch_grouping(create_model("vqa-transformer", modality_mask="patch-local", **kw), qa, spec.words, limit=20)
    assert local and all(v == 0.0 for v in local.values()), local
    first = patch_grouping(create_model("vqa-transformer", modality_mask="image-first", **kw), qa, spec.words, limit=20)
    assert first["patch_grouping_ratio_layer0"] == 0.0
    assert first["patch_grouping_ratio_layer1"] == pytest.approx(1.0, abs=0.1), first


def test_a_patch_size_that_does_not_divide_the_image_is_refused_in_one_line():
    with pytest.raises(TokennetError, match="must divide") as e:
        VQATransformerConfig(patch_size=12)
    assert "\n" not in str(e.value)
    with pytest.raises(TokennetError, match="patch_stem"):
        VQATransformerConfig(patch_stem="resnet")


def _bench():
    return load_bench("vqa_receptive_field")


def test_the_receptive_field_sweep_builds_its_fields_and_refuses_one_it_cannot_in_one_line(capsys, tmp_path):
    from tokennet.models.registry import create_model

    b = _bench()
    data = {"vocab_size": 32, "num_answers": 22}
    for f in b.FIELDS:
        s = b.cnn_settings(f, "depth", 150_000, data, "coords")
        m = create_model("vqa-cnn", **s)
        assert m.receptive_field().size == f and abs(m.num_parameters() - 150_000) < 15_000
    dilated = create_model("vqa-cnn", **b.cnn_settings(52, "dilation", 150_000, data, "coords"))
    assert dilated.receptive_field().size == 52
    for f in b.RESNET_FIELDS:  # residual blocks: two convs each, the field checked on the built trunk
        s = b.cnn_settings(f, "depth", 150_000, data, "coords", "resnet")
        m = create_model("vqa-cnn", **s)
        assert s["arch"] == "resnet" and m.receptive_field().size == f
        assert abs(m.num_parameters() - 150_000) < 15_000
    dilated = create_model("vqa-cnn", **b.cnn_settings(52, "dilation", 150_000, data, "coords", "resnet"))
    assert dilated.receptive_field().size == 52 and dilated.config.depths == [1]
    for f in b.UNIT_FIELDS:  # one unit: its field is its window, the parameters matched as the pooled ones'
        m = create_model("vqa-cnn", **b.cnn_settings(f, "depth", 150_000, data, "coords", family="unit"))
        assert m.config.readout == "unit" and m.receptive_field().size == f
        assert abs(m.num_parameters() - 150_000) < 15_000
    widths = set()
    for f in b.FIELD_FIELDS:  # the recipe's baselines' family: strided stages, every field at the 68-px one's width
        s = b.cnn_settings(f, "depth", 150_000, data, "coords", family="field")
        m = create_model("vqa-cnn", **s)
        assert m.config.readout == "flatten" and m.receptive_field().size == f
        widths.add(s["widths"][0])
    assert len(widths) == 1 and abs(m.num_parameters() - 150_000) < 15_000
    wide = b.cnn_settings(64, "depth", 150_000, data, "coords", family="unit", width=1.5, head_layers=2)
    assert wide["head_layers"] == 2 and create_model("vqa-cnn", **wide).num_parameters() > 200_000
    m = create_model("vqa-cnn", **b.cnn_settings(20, "depth", 150_000, data, "coords"))
    assert m(m.example_input()).logits.shape == (2, 22)  # the coordinate channels go in with the image
    out = tmp_path / "sweep.json"
    for argv, fragment in [(["--fields", "30"], "cannot be built by depth"),
                           (["--fields", "28", "--via", "dilation"], "cannot be built by dilation"),
                           (["--fields", "68"], "larger than the 64-pixel picture"),
                           (["--family", "unit", "--fields", "20", "128"], "larger than the 64-pixel picture"),
                           (["--family", "unit", "--fields", "30"], "whole 4-px patches"),
                           (["--family", "field", "--fields", "52"], "cannot be built by the field family"),
                           (["--jobs", "0"], "--jobs must be >= 1"),
                           (["--family", "vgg"], "--family must be"), (["--transformer", "big"], "--transformer must"),
                           (["--via", "width"], "--via must be"), (["--readout", "max"], "--readout must be"),
                           (["--arch", "resnet", "--fields", "28"], "cannot be built by depth with resnet"),
                           (["--arch", "vgg"], "--arch must be"), (["--trials", "-1"], "must be >= 0"),
                           (["--into", str(Path(__file__).parent)], "not a run directory")]:
        capsys.readouterr()
        assert b.main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and fragment in err, err
        assert not out.exists() and not out.with_suffix(".png").exists()  # nothing written
