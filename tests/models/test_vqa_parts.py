"""The vqa model's parts: the points readout (counts on a line, colours in RGB) and the stem that keeps shape and colour
apart, checked against their formulas and the properties their docstrings claim."""

import pytest
import torch

from tokennet.data.vqa import ANSWERS, COLOURS, Animal, Scene, render
from tokennet.errors import TokennetError
from tokennet.models.registry import create_model
from tokennet.models.vqa import AnswerHead, ShapeColourStem, VQACNNConfig, VQATransformerConfig, answer_points


def test_answer_points_are_numbers_and_named_colours():
    v = answer_points(ANSWERS, COLOURS)
    assert v[:10] == [[float(i)] for i in range(10)]
    assert v[ANSWERS.index("red")] == list(COLOURS["red"])
    assert v[ANSWERS.index("yes")] is None and v[ANSWERS.index("bird")] is None
    assert answer_points(["3", "red"]) == [[3.0], None]  # colours only when given


def _points_head(dim=8):
    torch.manual_seed(0)
    return AnswerHead(dim, len(ANSWERS), "points", answer_points(ANSWERS, COLOURS))


def test_point_logits_are_the_formula_in_the_answers_order():
    head = _points_head()
    for p in head.parameters():
        torch.nn.init.normal_(p)
    h = torch.randn(5, 8)
    out = head(h)
    count, colour = head.spaces[0](h), head.spaces[1](h)  # spaces by size: counts (1), colours (3)
    s = head.log_sharpness.exp()
    words = head.linear(h)
    word_answers = [a for a in ANSWERS if not a.isdigit() and a not in COLOURS]
    for j, a in enumerate(ANSWERS):
        if a.isdigit():
            want = count[:, 1] - s[0] * (count[:, 0] - float(a)) ** 2
        elif a in COLOURS:
            want = colour[:, 3] - s[1] * ((colour[:, :3] - torch.tensor(COLOURS[a])) ** 2).sum(-1)
        else:
            want = words[:, word_answers.index(a)]
        torch.testing.assert_close(out[:, j], want)


def test_the_count_with_the_highest_logit_is_the_one_nearest_k_hat():
    head = _points_head()
    h = torch.randn(64, 8)
    with torch.no_grad():
        head.spaces[0].weight.normal_()
        head.spaces[0].bias[1] = 1e3  # "the answer is a count" wins over every other answer
    k = head.position(h)[:, 0]
    best = head(h).argmax(-1)
    nearest = (k[:, None] - torch.arange(10.0)).abs().argmin(-1)
    assert torch.equal(best, nearest)


def test_points_start_at_their_mean_and_vote_weights_are_the_gradient():
    head = _points_head()
    h = torch.randn(3, 8)
    torch.testing.assert_close(head.position(h), torch.full((3, 1), 4.5))
    torch.testing.assert_close(head.position(h, 1), torch.tensor(list(COLOURS.values())).mean(0).expand(3, 3))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    answer = torch.tensor([3, 11, ANSWERS.index("red")])  # a count, a word, a colour
    w = head.vote_weights(h, answer)
    for i in range(3):
        x = h[i:i + 1].clone().requires_grad_(True)
        head(x)[0, answer[i]].backward()
        torch.testing.assert_close(w[i], x.grad[0])
    cls = AnswerHead(8, len(ANSWERS))
    assert torch.equal(cls.vote_weights(h, answer), cls.linear.weight[answer])


def test_the_points_readout_needs_a_point_or_null_per_answer():
    with pytest.raises(TokennetError, match="answer_points"):
        VQATransformerConfig(num_answers=3, answer_readout="points", answer_points=[[1], [2]])
    empty = VQATransformerConfig(num_answers=22, answer_readout="points")  # a recipe's defaults, before the data
    with pytest.raises(TokennetError, match="fills them from the data"):
        create_model("vqa-transformer", **{k: v for k, v in empty.to_dict().items() if k != "family"})
    with pytest.raises(TokennetError, match="two answers"):
        VQACNNConfig(num_answers=3, answer_readout="points", answer_points=[[1], None, None])
    with pytest.raises(TokennetError, match="answer_readout"):
        VQATransformerConfig(answer_readout="regress")


@pytest.mark.parametrize("preset", ["vqa-transformer", "vqa-cnn"])
def test_both_models_train_a_step_with_the_points_readout_and_the_cnn_draws_its_map(preset):
    extra = {"patch_stem": "shape,colour"} if preset == "vqa-transformer" else {}
    m = create_model(preset, num_answers=len(ANSWERS), answer_readout="points",
                     answer_points=answer_points(ANSWERS, COLOURS), **extra)
    x = m.example_input(4)
    out = m(x, torch.tensor([0, 3, 9, 12]))
    out.loss.backward()
    assert out.logits.shape == (4, len(ANSWERS)) and torch.isfinite(out.loss)
    if preset == "vqa-cnn":
        maps, answers = m.answer_map(x)
        assert maps.shape[0] == 4 and answers.shape == (4,)


def _corner_interaction(model, draws: int = 8) -> float:
    """``f(a, b) − f(a′, b) − f(a, b′) + f(a′, b′)``, largest over the logits and ``draws`` random contents of the top
    left (``a``) and bottom right (``b``) corner cells: how much the answer's dependence on one corner changes with
    the other (0 for a sum of local votes that never see both; a ReLU network is linear between its switches, so
    one draw may cross none)."""
    generator = torch.Generator().manual_seed(0)
    base, question = model.example_input(1)
    images = base.repeat(4 * draws, 1, 1, 1)
    for draw in range(draws):
        a, b = torch.rand(2, 3, 16, 16, generator=generator), torch.rand(2, 3, 16, 16, generator=generator)
        for k, (i, j) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
            images[4 * draw + k, :, :16, :16], images[4 * draw + k, :, 48:, 48:] = a[i], b[j]
    with torch.no_grad():
        f = model((images, question.repeat(4 * draws, 1))).logits.view(draws, 4, -1)
    return float((f[:, 0] - f[:, 1] - f[:, 2] + f[:, 3]).abs().max())


def test_the_flatten_readout_reads_every_unit_and_a_field_that_misses_a_corner_cannot_compare_two():
    torch.manual_seed(0)
    deep = create_model("vqa-cnn", widths=[16] * 4).eval()  # 68-px field: its 2×2 units see both corners
    shallow = create_model("vqa-cnn-shallow", widths=[16] * 3).eval()  # 36 px: no unit sees two corner cells
    assert deep.config.readout == shallow.config.readout == "flatten"
    x = deep.example_input(3)
    with torch.no_grad():
        votes, answer = deep.answer_map(x)  # (3, 2, 2): each unit's own term of the answer's logit
        logits = deep(x).logits
    torch.testing.assert_close(votes.sum((1, 2)) + deep.head.linear.bias[answer], logits[torch.arange(3), answer])
    # The shallow model's answer is a sum of terms that each see at most one corner cell: exactly additive in the two
    # (up to float rounding); the deep one's units combine them.
    assert _corner_interaction(shallow) < 1e-5  # rounding of logits of size ~1 in float32
    assert _corner_interaction(deep) > 1e-3


def _scene(colour: str) -> torch.Tensor:
    a = Animal("bird", colour, 1, 2, 18, 36, 14, False)
    return torch.from_numpy(render(Scene((a,)), seed=0))


def test_the_shape_path_sees_the_silhouette_not_the_colour_and_the_colour_path_the_colour_not_the_shape():
    std = [0.25, 0.25, 0.25]
    stem = ShapeColourStem(3, 16, 16, 8, std)
    red, blue = _scene("red"), _scene("blue")
    mean = torch.tensor([0.9, 0.88, 0.82])[:, None, None]
    x = (torch.stack([red, blue]) - mean) / torch.tensor(std)[:, None, None]
    f = stem.foreground(x)  # (2, 1, 64, 64)
    body = f[0, 0] == 1
    assert body.sum() > 50  # the bird's pixels are fully "not background"
    assert torch.equal(f[0, 0] == 1, f[1, 0] == 1)  # the same silhouette, whatever the colour
    assert float(f[:, 0, :16, :16].max()) == 0.0  # an empty patch is background
    tokens = stem(x)
    patch = 1 * 4 + 2  # the bird's cell
    assert not torch.allclose(tokens[0, patch], tokens[1, patch])  # the colour path tells them apart
    torch.testing.assert_close(stem.shape(f)[0], stem.shape(f)[1], atol=0.05, rtol=0)  # the shape path hardly


def test_two_tokens_per_patch_give_per_patch_maps_whose_rows_sum_to_one():
    m = create_model("vqa-transformer", patch_stem="shape,colour", dim=32, num_heads=2)
    x = m.example_input(3)
    z, _ = m._tokens(x)
    c = m.config
    assert z.shape[1] == c.num_text + 2 * c.num_patches
    full = [w["self"] for w in m.forward_features(x, return_attention=True)[1]]
    maps = m.attention_maps(x)["self"]
    nt, n = c.num_text, c.num_patches
    for a, f in zip(maps, full, strict=True):
        assert a.shape[-1] == a.shape[-2] == nt + n
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
        torch.testing.assert_close(a[..., 0, nt + 5], f[..., 0, nt + 5] + f[..., 0, nt + n + 5])  # the patch's weight
        torch.testing.assert_close(a[..., nt + 5, 0], (f[..., nt + 5, 0] + f[..., nt + n + 5, 0]) / 2)
    assert m.question_attention(x)[0].shape == (3, c.num_heads, n)


@pytest.mark.parametrize("mask", ["patch-local", "summary-reads"])
def test_local_patches_attend_only_to_their_own_patch_in_every_layer_and_only_the_summary_reads(mask):
    m = create_model("vqa-transformer", patch_stem="shape,colour", dim=32, num_heads=2, modality_mask=mask)
    x = m.example_input(2)
    c = m.config
    nt, n = c.num_text, c.num_patches
    own = torch.eye(n).expand(2, c.num_heads, n, n)
    for a in m.attention_maps(x)["self"]:  # per patch: a patch's row is all on its own column
        torch.testing.assert_close(a[:, :, nt:, nt:], own)
        assert a[:, :, 0, nt:].sum() > 0  # the summary token reads the image
        words_read = a[:, :, 1:nt, nt:].sum()
        assert (words_read == 0) if mask == "summary-reads" else (words_read > 0)


@pytest.mark.parametrize("mask", ["patch-local", "image-first"])
def test_shape_reads_colour_keeps_every_colour_token_pure_colour(mask):
    """``pair_binding="shape-reads-colour"``: a shape token attends to its patch's colour token, a colour token only
    to itself (every layer of patch-local; layer 0 of image-first) — its vector is a function of the colour alone."""
    torch.manual_seed(0)
    m = create_model("vqa-transformer", patch_stem="shape,colour", dim=32, num_heads=2, num_layers=2,
                     modality_mask=mask, pair_binding="shape-reads-colour")
    c = m.config
    nt, n = c.num_text, c.num_patches
    full = [w["self"] for w in m.forward_features(m.example_input(2), return_attention=True)[1]]
    for layer, f in enumerate(full[:2 if mask == "patch-local" else 1]):
        colour_rows = f[:, :, nt + n:, :]  # (B, H, n, L): the colour tokens' queries
        torch.testing.assert_close(colour_rows[..., nt + n:], torch.eye(n).expand(2, c.num_heads, n, n))
        shape_rows = f[:, :, nt:nt + n, nt:]
        pair = torch.eye(n).repeat(1, 2).bool()  # a shape token's own shape and colour columns
        assert (shape_rows[..., pair].reshape(2, c.num_heads, n, 2) > 0).all(), layer
        torch.testing.assert_close(shape_rows.sum(-1), torch.ones(2, c.num_heads, n))
    both = create_model("vqa-transformer", patch_stem="shape,colour", dim=32, num_heads=2, modality_mask=mask)
    a = [w["self"] for w in both.forward_features(both.example_input(2), return_attention=True)[1]][0]
    assert a[:, :, nt + n:, nt:nt + n].sum() > 0  # "both" (the default before): a colour token reads its shape
    with pytest.raises(TokennetError, match="pair_binding"):
        create_model("vqa-transformer", pair_binding="colour-reads-shape", dim=32, num_heads=2)


def test_image_first_lets_patches_meet_other_patches_after_the_first_layer():
    m = create_model("vqa-transformer", patch_stem="shape,colour", dim=32, num_heads=2, modality_mask="image-first")
    maps = m.attention_maps(m.example_input(2))["self"]
    nt, n = m.config.num_text, m.config.num_patches
    torch.testing.assert_close(maps[0][:, :, nt:, nt:], torch.eye(n).expand_as(maps[0][:, :, nt:, nt:]))
    assert (maps[1][:, :, nt:, nt:] * (1 - torch.eye(n))).sum() > 0


def test_sink_logit_is_a_learned_score_per_layer_and_head_on_the_sink_column_only():
    kw = dict(patch_stem="shape,colour", dim=32, num_heads=2, num_layers=2)
    plain = create_model("vqa-transformer", **kw)
    x = plain.example_input(2)
    torch.manual_seed(0)
    m = create_model("vqa-transformer", sink_logit=0.0, **kw)
    assert m.sink_logit.shape == (2 * 2,)
    base = m.attention_maps(x)["self"]
    with torch.no_grad():
        m.sink_logit[1] = 3.0  # layer 0, head 1
    maps = m.attention_maps(x)["self"]
    a0, b0 = maps[0], base[0]
    torch.testing.assert_close(a0[:, 0], b0[:, 0])  # head 0 unchanged
    # head 1: the sink's score rose by 3, every other score as before: weights = softmax with that one score moved
    s = b0[:, 1].clone()
    s[..., 1] *= torch.e ** 3
    s = s / s.sum(-1, keepdim=True)
    torch.testing.assert_close(a0[:, 1], s, atol=1e-5, rtol=1e-4)
    nt = m.config.num_text
    assert (a0[:, 1, :nt, 1] > b0[:, 1, :nt, 1]).all()  # every question token rests more on the sink
    with pytest.raises(TokennetError, match="sink_logit"):
        create_model("vqa-transformer", sink=False, sink_logit=1.0, dim=32, num_heads=2)
