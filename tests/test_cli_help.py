"""Help that helps: `tokennet list` says what each recipe trains (its own model size, not the preset's), and
`generate --help` stays short where the details live in the docs (issue 61)."""

import re
from pathlib import Path

from tokennet.cli import _subcommand, build_parser, main
from tokennet.lifecycle import list_recipes
from tokennet.models.registry import preset_info

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_list_says_what_each_recipe_trains_at_its_own_size(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for recipe in list_recipes():
        settings = recipe.defaults()
        line = re.search(rf"^  {re.escape(recipe.name)} .*\n +trains (.*)$", out, re.M)
        assert line, f"{recipe.name}: no 'trains' line"
        if "num_layers" in settings and "dim" in settings:
            assert f"{settings['num_layers']} layers × {settings['dim']} wide" in line.group(1), line.group(1)
    # the gpt preset is GPT-2 shaped; the gpt recipe trains a smaller one, and both are said
    assert "6 layers × 384" in preset_info("gpt")[2]
    assert re.search(r"^  gpt .*\n +trains the gpt model at 4 layers × 128 wide", out, re.M)


def test_generate_help_keeps_quantize_to_a_few_lines_and_the_docs_hold_the_rest(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _subcommand(build_parser(), "generate").format_help()
    entry = text.split("--quantize {", 2)[2].split("\n  --", 1)[0]  # the option's entry, not the usage line
    assert entry.count("\n") <= 9, entry
    assert "docs/tutorials/checkpoints-and-serving.md" in entry
    tutorial = (DOCS / "tutorials" / "checkpoints-and-serving.md").read_text(encoding="utf-8")
    for detail in ("AVX-512 VNNI", "TOKENNET_INT8DOT=0", "TOKENNET_BLOCKDOT=0", "Q4_1", "column blocks"):
        assert detail in tutorial.split("## Low-precision decoding", 1)[1].split("\n## ", 1)[0], detail


def test_a_message_naming_a_task_takes_its_article():
    from tokennet.plugins import list_tasks

    names = {task.name: task.a_name for task in list_tasks().values()}
    assert names["image classification"] == "an image classification"
    assert names["language model"] == "a language model"
