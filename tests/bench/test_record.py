"""bench/_record.py's ``write``: every bench JSON says how it was run, on which commit and machine, with which
settings, before its results."""

import json

from support import load_bench


def _record():
    return load_bench("_record")


def test_write_records_command_commit_machine_settings_then_results(tmp_path):
    rec = _record()
    out = tmp_path / "sub" / "x.json"
    written = rec.write(out, {"rows": [1.5], "machine": {"threads": 1}, "path": tmp_path}, settings={"steps": 3},
                        argv=["--steps", 3], script="x.py", torch="2.x")
    on_disk = json.loads(out.read_text())
    assert list(on_disk)[:5] == ["command", "commit", "date", "machine", "settings"]
    assert on_disk["command"] == "python bench/x.py --steps 3"
    assert on_disk["machine"]["cpus"] and on_disk["machine"]["threads"] == 1 and on_disk["machine"]["torch"] == "2.x"
    assert on_disk["settings"] == {"steps": 3} and on_disk["rows"] == [1.5] and on_disk["path"] == str(tmp_path)
    assert written["rows"] == [1.5]


def test_a_command_given_in_the_results_is_kept(tmp_path):
    rec = _record()
    on_disk = rec.write(tmp_path / "y.json", {"command": "tokennet train vit", "acc": 0.5})
    assert on_disk["command"] == "tokennet train vit" and "settings" not in on_disk
