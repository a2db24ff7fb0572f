"""docs/python-api.md is generated from tokennet.__all__ (tokennet.api_reference), and its examples run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tokennet
from tokennet import api_reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_docs_python_api_md_is_what_the_package_exports():
    assert api_reference.check(DOC), f"docs/python-api.md is out of date; regenerate it: {api_reference.REGENERATE}"


def test_every_export_has_an_entry_in_its_group():
    text = api_reference.render()
    for name in tokennet.__all__:
        group = api_reference.group_of(getattr(tokennet, name))
        section = text.split(f"\n## {group.title}\n", 1)[1].split("\n## ", 1)[0]
        assert f"### `tokennet.{name}`" in section, (name, group.title)
    for group in api_reference.GROUPS:
        assert f"\n## {group.title}\n" in text


def test_signatures_are_the_same_on_every_machine(monkeypatch):
    first = api_reference.render()
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("/nonexistent-home")))
    assert api_reference.render() == first
    assert " at 0x" not in first


def test_a_long_signature_is_one_parameter_a_line():
    def wide(alpha: dict[str, int] | None = None, *, beta: tuple[int, int] = (1, 2), gamma: str = "a, b",
             delta_with_a_long_name: float = 1.0, epsilon_with_a_long_name: bool = False) -> list[int]:
        """A function whose signature is wider than the page."""
    assert api_reference.signature(wide).splitlines() == [
        "(", "    alpha: dict[str, int] | None = None,", "    *,", "    beta: tuple[int, int] = (1, 2),",
        "    gamma: str = 'a, b',", "    delta_with_a_long_name: float = 1.0,",
        "    epsilon_with_a_long_name: bool = False,", ") -> list[int]"]
    assert api_reference.summary(wide) == "A function whose signature is wider than the page."


def test_check_exits_1_and_names_the_command_when_the_file_differs(tmp_path, capsys):
    stale = tmp_path / "python-api.md"
    stale.write_text("# an old page\n", encoding="utf-8")
    assert api_reference.main(["--check", str(stale)]) == 1
    assert api_reference.REGENERATE in capsys.readouterr().err


def test_the_page_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_the_example_runs(index, tmp_path, monkeypatch):
    """Each ```python block of the page runs on its own (decoding eagerly, as the suite does)."""
    monkeypatch.setenv("TOKENNET_COMPILE", "0")
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs/python-api.md, example {index + 1}", "exec"), {"__name__": "__doc_example__"})
