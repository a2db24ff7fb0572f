"""Questions about pictures: the answers are right, the held-out combinations stay out, a user's directory."""

import random
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from tokennet.data.vqa import (
    ALL_COLOURS,
    ANSWERS,
    CELL,
    COLOURS,
    CORNERS,
    GRID,
    PLURAL,
    SPECIES,
    AnimalQuestions,
    QABatches,
    encode_questions,
    held_out_counts,
    held_out_kinds,
    question_words,
    read_question_dir,
    render,
    sample_item,
    sample_items,
    tokenize_question,
    write_question_dir,
)
from tokennet.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")


def _check_answer(it) -> None:
    """Recompute the item's answer from its scene."""
    animals = it.scene.animals
    q = it.question.rstrip("?")
    if it.template in ("count", "unseen_count") and q.split()[2] in {"birds", "fish", "cats", "impalas", "turtles",
                                                                     "animals"}:
        word = q.split()[2]
        n = len(animals) if word == "animals" else sum(a.species == SPECIES[[
            "birds", "fish", "cats", "impalas", "turtles"].index(word)] for a in animals)
        assert it.answer == str(n)
    elif it.template in ("count_colour", "unseen_count"):
        colour = q.split()[2]
        assert it.answer == str(sum(a.colour == colour for a in animals))
    elif it.template == "same_species":
        words = q.split()
        a, b = " ".join(words[2:4]), " ".join(words[-3:-1])
        ka, kb = it.scene.at(CORNERS[a]), it.scene.at(CORNERS[b])
        assert ka is not None and kb is not None
        assert it.answer == ("yes" if ka.species == kb.species else "no")
        assert set(it.about) == {ka, kb}
    elif it.template == "species":
        corner = " ".join(q.split()[4:6])
        target = it.scene.at(CORNERS[corner])
        assert target is not None and it.answer == target.species and it.about == (target,)
    else:
        species = q.split()[-1]
        matching = [a for a in animals if a.species == species]
        assert len(matching) == 1 and it.answer == matching[0].colour


def test_every_answer_follows_from_the_scene_and_is_one_word():
    for held in (False, True):
        for it in sample_items(400, "check", seed=3, held_out=held):
            _check_answer(it)
            assert it.answer in ANSWERS
            assert 1 <= len(it.scene.animals) <= 9
            cells = [(a.row, a.col) for a in it.scene.animals]
            assert len(set(cells)) == len(cells)
            for a in it.scene.animals:  # each animal inside its own cell
                assert a.row * CELL <= a.top and a.top + a.size <= (a.row + 1) * CELL
                assert a.col * CELL <= a.left and a.left + a.size <= (a.col + 1) * CELL


def test_held_out_kinds_never_in_training_always_in_the_test():
    hk = held_out_kinds(0)
    assert len(hk) == 5 and {s for s, _ in hk} == set(SPECIES) and {c for _, c in hk} == set(COLOURS)
    for it in sample_items(500, "train-0", seed=0, held_out=False):
        assert not any(a.kind in hk for a in it.scene.animals)
    for it in sample_items(300, "test", seed=0, held_out=True):
        assert any(a.kind in hk for a in it.scene.animals)
    assert held_out_kinds(1) != hk  # the seed chooses


def test_held_out_counts_never_asked_in_training_only_in_their_own_test():
    hc = held_out_counts(0)
    assert len(hc) == len(SPECIES) + 1 + len(COLOURS)  # one per count question
    asked = {(it.question.rstrip("?"), int(it.answer)) for held in (False, True)
             for it in sample_items(2000, f"c{held}", seed=0, held_out=held) if it.template.startswith("count")}
    assert not asked & hc
    rng = random.Random(0)
    unseen = [sample_item(rng, seed=0, held_out=True, template="unseen_count") for _ in range(200)]
    assert all((it.question.rstrip("?"), int(it.answer)) in hc for it in unseen)
    for it in unseen:
        _check_answer(it)


def test_answers_are_balanced_within_a_template():
    items = sample_items(3000, "balance", seed=0, held_out=False)
    yes = Counter(it.answer for it in items if it.template == "same_species")
    assert abs(yes["yes"] - yes["no"]) < 0.15 * sum(yes.values())
    counts = Counter(it.answer for it in items if it.template == "count_colour")
    assert len(counts) == 10 and max(counts.values()) < 3 * min(counts.values())


def test_generation_is_a_pure_function_of_the_seed():
    a = sample_items(20, "k", seed=5, held_out=False)
    b = sample_items(20, "k", seed=5, held_out=False)
    assert [x.question for x in a] == [x.question for x in b] and [x.scene for x in a] == [x.scene for x in b]
    np.testing.assert_array_equal(render(a[0].scene, seed=1), render(b[0].scene, seed=1))
    spec = AnimalQuestions(test_size=30, val_size=10).filled()
    src = QABatches(spec, 8, 16)
    (x1, q1), y1 = src.batch(3)
    (x2, q2), y2 = QABatches(spec, 8, 16).batch(3)
    assert torch.equal(x1, x2) and torch.equal(q1, q2) and torch.equal(y1, y2)
    assert x1.shape == (8, 3, 64, 64) and x1.dtype == torch.float32 and 0 <= x1.min() and x1.max() <= 1


def test_render_draws_each_animal_in_its_colour():
    it = sample_items(1, "draw", seed=0, held_out=False)[0]
    img = render(it.scene, seed=0)
    for a in it.scene.animals:
        patch = img[:, a.top:a.top + a.size, a.left:a.left + a.size]
        # The sprite's most saturated pixel is near the animal's colour (±0.12 jitter).
        sat = patch.max(0) - patch.min(0)
        r, c = np.unravel_index(sat.argmax(), sat.shape)
        px = patch[:, r, c]
        assert np.abs(px - np.array(ALL_COLOURS[a.colour])).max() < 0.15


def test_questions_as_tokens_and_their_errors():
    words = question_words()
    assert tokenize_question("How many birds are there?") == ["how", "many", "birds", "are", "there"]
    ids = encode_questions(["how many birds are there?"], words, 16)
    assert ids.shape == (1, 16) and (ids[0, :5] > 0).all() and (ids[0, 5:] == 0).all()
    with pytest.raises(DataError, match="outside the model's vocabulary: dragons"):
        encode_questions(["how many dragons are there?"], words, 16)
    with pytest.raises(DataError, match="is empty"):
        encode_questions(["  ?? "], words, 16)
    with pytest.raises(DataError, match="at most 3"):
        encode_questions(["how many birds are there"], words, 3)
    every = {w for it in sample_items(500, "w", seed=0, held_out=True) for w in tokenize_question(it.question)}
    assert every <= set(words)
    assert GRID * CELL == 64


def test_a_question_directory_round_trip(tmp_path):
    d = write_question_dir(tmp_path / "qa", 24, seed=0)
    u = read_question_dir(str(d))
    assert len(u.train) == 18 and len(u.test) == 6 and u.image_size == 64
    assert set(u.answers) <= set(ANSWERS) and u.words[0] == "<pad>"
    spec = AnimalQuestions(source=str(d)).filled()
    assert spec.words == u.words and len(spec.held_out()) == 6
    (x, q), y = QABatches(spec, 4, 16).batch(0)
    assert x.shape == (4, 3, 64, 64) and y.max() < len(spec.answers)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: (d / "answers.tsv").unlink(), "has no answers.tsv"),
    (lambda d: (d / "answers.tsv").write_text("picture\tquestion\tanswer\nx.png\thi\tno\n"), "no column image"),
    (lambda d: (d / "answers.tsv").write_text("image\tquestion\tanswer\nimages/00000.png\thow many\n"),
     "line 2: 2 tab-separated fields"),
    (lambda d: (d / "answers.tsv").write_text("image\tquestion\tanswer\nimages/00000.png\thow many\t\n"),
     "line 2: the answer is empty"),
    (lambda d: (d / "answers.tsv").write_text("image\tquestion\tanswer\tsplit\nimages/00000.png\thow\t3\tval\n"),
     "split must be train or test"),
    (lambda d: (d / "answers.tsv").write_text("image\tquestion\tanswer\nnope.png\thow many\t3\n"), "does not exist"),
    (lambda d: (d / "answers.tsv").write_text("image\tquestion\tanswer\nimages/00000.png\thow many\ttwo words\n"),
     "not one word"),
])
def test_a_bad_question_directory_fails_in_one_line(tmp_path, edit, message):
    d = write_question_dir(tmp_path / "qa", 6, seed=0)
    edit(d)
    with pytest.raises(DataError, match=message) as e:
        read_question_dir(str(d))
    assert "\n" not in str(e.value)


def _intended_count_answers(seed: int) -> dict[str, float]:
    """The count answers' intended distribution (``count`` and ``count_colour`` together, as many questions
    each): each question drawn uniformly, its count uniformly over 0 … 9 (1 … 9 for *animals*) less its
    held-out count."""
    hc = held_out_counts(seed)
    questions = [(f"how many {PLURAL[s]} are there", 1 if s == "animal" else 0) for s in (*SPECIES, "animal")]
    questions += [(f"how many {c} animals are there", 0) for c in COLOURS]
    out: Counter = Counter()
    for group in (questions[:len(SPECIES) + 1], questions[len(SPECIES) + 1:]):
        for q, lo in group:
            ks = [k for k in range(lo, 10) if (q, k) not in hc]
            for k in ks:
                out[k] += 1 / (len(group) * len(ks))  # the draw repeats on a held-out count: uniform over ks
    return {str(k): v / 2 for k, v in out.items()}


def test_the_default_test_set_asks_counts_and_crowds_as_training_does():
    """The default test set's count answers follow the intended distribution and its scenes are no more
    crowded than training's: putting the held-out kind in on purpose biases nothing (rejecting scenes without
    one answered 8 sixty times and 0 twenty-five times in 410 count questions; its mean count was 5.05, 5.0
    standard errors above the intended 4.55, and it had 480 nine-animal scenes to training's 372)."""
    spec = AnimalQuestions()
    test = sample_items(spec.test_size, "test", seed=spec.seed, held_out=True, num_clutter=spec.clutter)
    like = sample_items(spec.test_size, "train-like", seed=spec.seed, held_out=False, num_clutter=spec.clutter)
    hk = held_out_kinds(spec.seed)
    assert all(any(a.kind in hk for a in it.scene.animals) for it in test)
    answers = Counter(it.answer for it in test if it.template in ("count", "count_colour"))
    n = sum(answers.values())
    p = _intended_count_answers(spec.seed)
    assert set(answers) == set(p) and abs(sum(p.values()) - 1) < 1e-9
    mean = sum(int(a) * c for a, c in answers.items()) / n
    want = sum(int(a) * q for a, q in p.items())
    sd = sum((int(a) - want) ** 2 * q for a, q in p.items()) ** 0.5
    assert abs(mean - want) < 3 * sd / n ** 0.5, (mean, want, answers)
    chi2 = sum((answers[a] - n * q) ** 2 / (n * q) for a, q in p.items())
    assert chi2 < 27.9, (chi2, answers)  # 9 degrees of freedom, p = 0.001
    crowd = Counter(len(it.scene.animals) for it in test)
    crowd_like = Counter(len(it.scene.animals) for it in like)
    # Two samples of the same size: chi-square of homogeneity over the 9 sizes (8 degrees of freedom, p = 0.001).
    chi2 = sum((crowd[k] - crowd_like[k]) ** 2 / (crowd[k] + crowd_like[k]) for k in range(1, 10))
    assert chi2 < 26.1, (chi2, sorted(crowd.items()), sorted(crowd_like.items()))


@pytest.mark.parametrize("with_split", [False, True])
def test_a_large_question_directory_splits_right_in_one_pass(tmp_path, with_split):
    """4,000 questions about 1,000 images (and 500 answers): every question on its image's side (a seeded 20% of
    the images without a split column) or on its own ``split`` side, with its own image and answer. Splitting
    looked each row up in the list of training rows before (about 8 million row comparisons here, quadratic in
    the directory's size); now it is one pass."""
    n_images, per_image = 1000, 4
    (tmp_path / "img").mkdir()
    for i in range(n_images):  # each image's pixels tell which it is
        np.save(tmp_path / "img" / f"{i}.npy", np.full((3, 8, 8), i / n_images, np.float32))
    rows, want = ["image\tquestion\tanswer" + ("\tsplit" if with_split else "")], {}
    for i in range(n_images):
        for j in range(per_image):
            q, a = f"how many birds are there {j}", f"a{(i * per_image + j) % 500}"
            split = "test" if (i * per_image + j) % 7 == 0 else "train"
            rows.append(f"img/{i}.npy\t{q}\t{a}" + (f"\t{split}" if with_split else ""))
            want[(i, q)] = (a, split)
    (tmp_path / "answers.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    u = read_question_dir(str(tmp_path))
    assert len(u.train) + len(u.test) == n_images * per_image and len(u.answers) == 500
    sides = {}
    for side, qa in (("train", u.train), ("test", u.test)):
        ids = (qa.images[:, 0, 0, 0] * n_images).round().long().tolist()
        for i, q, a in zip(ids, qa.questions, qa.answers.tolist(), strict=True):
            answer, split = want.pop((i, q))  # each question once, with its own image
            assert u.answers[a] == answer
            if with_split:
                assert side == split
            sides.setdefault(i, set()).add(side)
    assert not want
    if with_split:
        assert len(u.test) == sum(k % 7 == 0 for k in range(n_images * per_image))
    else:  # whole images on one side, a fifth of them in the test set
        assert all(len(s) == 1 for s in sides.values())
        assert sum(s == {"test"} for s in sides.values()) == round(0.2 * n_images)


@pytest.mark.parametrize("escape", ["dotdot", "absolute", "symlink", "symlinked dir"])
def test_an_image_path_outside_the_directory_is_one_line_naming_the_row(tmp_path, escape):
    """answers.tsv may name only images inside the directory that holds it (issue 44): a row whose path leaves it
    by ``..``, an absolute path or a symbolic link is refused before any image is read."""
    d = write_question_dir(tmp_path / "qa", 6, seed=0)
    outside = tmp_path / "secret.png"
    shutil.copy(d / "images" / "00000.png", outside)  # a readable image: only its place is wrong
    name = {"dotdot": "../secret.png", "absolute": str(outside), "symlink": "images/link.png",
            "symlinked dir": "elsewhere/secret.png"}[escape]
    if escape == "symlink":
        (d / "images" / "link.png").symlink_to(outside)
    elif escape == "symlinked dir":
        (d / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    lines = (d / "answers.tsv").read_text().splitlines()
    lines[3] = "\t".join([name, *lines[3].split("\t")[1:]])
    (d / "answers.tsv").write_text("\n".join(lines) + "\n")
    read_question_dir.cache_clear()
    with pytest.raises(DataError) as e:
        read_question_dir(str(d))
    msg = str(e.value)
    assert "\n" not in msg and "answers.tsv, line 4" in msg and "outside" in msg and name in msg, msg


def test_an_image_symlinked_inside_the_directory_still_reads(tmp_path):
    d = write_question_dir(tmp_path / "qa", 6, seed=0)
    first = (d / "answers.tsv").read_text().splitlines()[1].split("\t")[0]
    (d / "images" / "alias.png").symlink_to(d / first)
    lines = (d / "answers.tsv").read_text().splitlines()
    lines[1] = "\t".join(["images/alias.png", *lines[1].split("\t")[1:]])
    (d / "answers.tsv").write_text("\n".join(lines) + "\n")
    read_question_dir.cache_clear()
    assert read_question_dir(str(d)).image_size == 64
