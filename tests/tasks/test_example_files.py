"""``tokennet examples RUN --out DIR``: held-out inputs as files, their labels and index; refusals write nothing.

Every registered task's examples are also generated from in tests/recipes/test_every_recipe.py
(``test_examples_writes_inputs_that_generate_answers``); here, one small image run and the command's edges.
"""

from __future__ import annotations

import json
import shlex

import pytest
from PIL import Image
from support import setting_value

from tokennet.cli import main
from tokennet.lifecycle import list_recipes
from tokennet.models.gpt import GPTConfig
from tokennet.models.registry import model_from_config, save_pretrained
from tokennet.models.text_encoder import TextEncoderConfig
from tokennet.run import load
from tokennet.tasks import Example, Task
from tokennet.tasks.example_files import MAX_EXAMPLES, varied

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """A ViT on the 8×8 digits, trained two steps."""
    out = tmp_path_factory.mktemp("examples") / "vit"
    recipe = next(r for r in list_recipes() if r.name == "vit")
    sets = {**recipe.smoke, "max_iters": 2, "eval_interval": 0, "warmup_iters": 1, "progress": False}
    assert main(["-q", "train", "vit", "--out", str(out), "--set",
                 *(f"{k}={setting_value(v)}" for k, v in sets.items())]) == 0
    return out


def _run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_examples_are_pngs_with_the_held_out_labels_and_an_index(vit_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, printed, _ = _run(capsys, "examples", vit_run, "--out", "examples-vit", "--count", 4)
    assert code == 0
    data = load(vit_run).data.held_out()
    expected = [str(int(data.y_test[item])) for item in varied(data.y_test, 4, vit_run)]
    assert len(set(expected)) == 4, "four examples show four classes"
    index = json.loads((tmp_path / "examples-vit" / "examples.json").read_text())
    assert [e["label"] for e in index["examples"]] == expected
    for k, entry in enumerate(index["examples"]):
        assert entry["files"] == [f"image-{k}.png"] and entry["generate"] == {"--image": [f"image-{k}.png"]}
        with Image.open(tmp_path / "examples-vit" / f"image-{k}.png") as picture:
            assert picture.size == (8, 8)
        assert f"examples-vit/image-{k}.png  → {expected[k]}\n" in printed
    # The command it suggests runs as printed, and the model reads the file the data's way: the same logits.
    command = printed.strip().splitlines()[-1]
    assert command == "try: tokennet generate " + f"{vit_run} --image examples-vit/image-0.png"
    code, answer, _ = _run(capsys, *shlex.split(command)[2:])
    assert code == 0 and answer.startswith("examples-vit/image-0.png\t")


def test_the_python_api_returns_the_examples_where_they_now_are(vit_run, tmp_path):
    run = load(vit_run)
    examples = run.write_examples(tmp_path / "mine", 2)
    assert all(isinstance(e, Example) for e in examples) and len(examples) == 2
    assert examples[0].values == {"image": [str(tmp_path / "mine" / "image-0.png")]}
    assert examples[0].files == (tmp_path / "mine" / "image-0.png",)
    assert len(run.classify(examples[1].values["image"])) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder is left"


def test_writing_again_replaces_the_previous_examples_whole(vit_run, tmp_path, capsys):
    out = tmp_path / "ex"
    assert _run(capsys, "examples", vit_run, "--out", out, "--count", 3)[0] == 0
    assert _run(capsys, "examples", vit_run, "--out", out, "--count", 1)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["examples.json", "image-0.png"]
    (tmp_path / "empty").mkdir()
    assert _run(capsys, "examples", vit_run, "--out", tmp_path / "empty")[0] == 0
    assert len(json.loads((tmp_path / "empty" / "examples.json").read_text())["examples"]) == 3, "default: 3"


def _refused(capsys, argv, fragment: str) -> None:
    code, printed, err = _run(capsys, *argv)
    assert code == 2 and printed == "", (argv, code, printed)
    assert err.startswith("tokennet: error:") and err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("count", [0, -1, MAX_EXAMPLES + 1])
def test_a_bad_count_is_refused_and_nothing_is_written(vit_run, tmp_path, capsys, count):
    _refused(capsys, ["examples", vit_run, "--out", tmp_path / "new" / "ex", "--count", count], "--count")
    assert list(tmp_path.iterdir()) == []


def test_more_than_the_held_out_data_holds_is_refused_and_leaves_no_folder(vit_run, tmp_path, capsys):
    available = len(load(vit_run).data.held_out().y_test)
    assert available < MAX_EXAMPLES, "the digits' test set is 360 images"
    _refused(capsys, ["examples", vit_run, "--out", tmp_path / "a" / "b", "--count", available + 1],
             f"holds {available} held-out examples")
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_does_not_exist_is_refused(tmp_path, capsys):
    _refused(capsys, ["examples", tmp_path / "runs" / "nope", "--out", tmp_path / "ex"], "nope")
    assert list(tmp_path.iterdir()) == []


def test_an_out_that_is_a_file_or_someone_elses_folder_is_refused_untouched(vit_run, tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    _refused(capsys, ["examples", vit_run, "--out", file], "is a file")
    assert file.read_text() == "mine"
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.png").write_bytes(b"not mine to replace")
    _refused(capsys, ["examples", vit_run, "--out", folder], "did not write")
    assert [p.name for p in folder.iterdir()] == ["holiday.png"]


def test_a_task_without_examples_and_a_run_without_data_are_refused(tmp_path, capsys):
    encoder = tmp_path / "encoder"  # a text encoder (an imported sentence model's family): its task has no examples
    save_pretrained(model_from_config(TextEncoderConfig(vocab_size=30, max_len=8, dim=16, num_layers=1,
                                                        num_heads=2)), encoder)
    _refused(capsys, ["examples", encoder, "--out", tmp_path / "ex"], "text embedding run")
    bare = tmp_path / "bare"  # a model without run.json: a language model, but no held-out data of its own
    save_pretrained(model_from_config(GPTConfig(vocab_size=16, block_size=8, dim=16, num_layers=1, num_heads=2)), bare)
    _refused(capsys, ["examples", bare, "--out", tmp_path / "ex"], "no held-out data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "encoder"]
    with pytest.raises(Exception, match="no held-out examples"):
        Task().write_examples(load(bare), tmp_path / "ex")


def test_generate_without_an_input_says_how_to_get_one(vit_run, capsys):
    _refused(capsys, ["generate", vit_run], f"tokennet examples {vit_run} --out examples-{vit_run.name}")
