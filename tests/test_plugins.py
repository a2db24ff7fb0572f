"""Plugins: a task of one's own in a file (``tokennet --plugin FILE``) or in an installed package (the entry-point
group ``tokennet.plugins``) works with every command, with nothing changed in tokennet."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "count_ones.py"


def _tokennet(*argv, cwd, env=None, check=True) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    r = subprocess.run([sys.executable, "-m", "tokennet", *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                       env=e, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_example_file_trains_evaluates_generates_draws_and_reports_from_the_cli(tmp_path):
    """What the README shows, in fresh processes as a user runs it."""
    p = ["--plugin", EXAMPLE]
    _tokennet(*p, "train", "count-ones", "--out", "run", "--max-iters", "150", cwd=tmp_path)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    fresh = json.loads(_tokennet(*p, "eval", "run", cwd=tmp_path).stdout)
    assert fresh == {k: saved[k] for k in fresh}
    assert saved["test_accuracy"] > 0.5, saved  # 17 classes: chance is well below 0.2
    assert _tokennet(*p, "generate", "run", "--bits", "1" * 16, cwd=tmp_path).stdout.strip().isdigit()
    pngs = _tokennet(*p, "viz", "run", cwd=tmp_path).stdout.split()
    assert pngs and all(Path(tmp_path, f).is_file() for f in pngs)
    _tokennet(*p, "report", "run", cwd=tmp_path)
    assert "Held-out strings" in (tmp_path / "run" / "report.html").read_text()
    # Without the plugin, the run's model family is unknown: one line, exit 2.
    r = _tokennet("eval", "run", cwd=tmp_path, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bit-counter" in r.stderr


def _install(site: Path, module: Path, name: str) -> None:
    """An installed distribution as pip leaves it: the module and a dist-info with the entry point."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copy(module, site / module.name)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tokennet.plugins]\n{name} = {module.stem}\n")


def test_an_installed_package_registers_through_its_entry_point(tmp_path):
    site = tmp_path / "site"
    _install(site, EXAMPLE, "count_ones_plugin")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    listed = _tokennet("list", cwd=tmp_path, env=env).stdout
    assert "count-ones" in listed and "tokennet.plugins:count_ones_plugin" in listed
    _tokennet("train", "count-ones", "--out", "run", "--max-iters", "3", cwd=tmp_path, env=env)
    assert _tokennet("generate", "run", "--bits", "0" * 16, cwd=tmp_path, env=env).stdout.strip().isdigit()


def test_a_broken_installed_plugin_is_a_warning_not_a_broken_tokennet(tmp_path):
    site = tmp_path / "site"
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('this plugin is broken')\n")
    _install(site, broken, "broken_plugin")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    r = _tokennet("list", cwd=tmp_path, env=env)
    assert "gpt-char" in r.stdout and "broken_plugin" in r.stderr and "skipped" in r.stderr


def test_loading_a_plugin_file_twice_registers_it_once():
    from tokennet import plugins

    first = plugins.load_file(EXAMPLE)
    assert plugins.load_file(EXAMPLE) == first
    assert plugins.loaded().count(str(EXAMPLE.resolve())) == 1


@pytest.mark.parametrize(("content", "message"), [("x = (\n", "SyntaxError"), ("import no_such_module_xyz\n",
                                                                                  "ModuleNotFoundError")])
def test_a_plugin_that_fails_to_import_is_one_line_naming_the_file(tmp_path, content, message):
    f = tmp_path / "bad_plugin.py"
    f.write_text(content)
    r = _tokennet("--plugin", f, "list", cwd=tmp_path, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "bad_plugin.py" in r.stderr and message in r.stderr
