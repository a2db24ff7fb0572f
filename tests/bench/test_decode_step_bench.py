"""bench/decode_step.py with a fake measurement: medians over rounds, each tree's ratio to the first, the order of the
trees alternating from round to round, the JSON written; a --src that is not a checkout is refused."""

import json
from pathlib import Path

import pytest
from support import load_bench


def test_medians_ratios_and_alternating_order(tmp_path, monkeypatch):
    script = load_bench("decode_step")
    new, old = tmp_path / "new", tmp_path / "old"
    for tree in (new, old):
        (tree / "src" / "tokennet").mkdir(parents=True)
    calls = []
    figures = {"new": [10.0, 12.0, 11.0], "old": [20.0, 22.0, 21.0]}

    def fake(src: Path, run: str, args) -> dict:
        calls.append(src.name)
        eager = figures[src.name][sum(c == src.name for c in calls) - 1]
        return {"eager_ms": eager, "compiled_ms": eager / 2, "compiled": True}

    monkeypatch.setattr(script, "measure", fake)
    out = tmp_path / "r.json"
    result = script.main(["--run", "RUN", "--src", str(new), str(old), "--rounds", "3", "--out", str(out)])
    assert calls == ["new", "old", "old", "new", "new", "old"]
    med = result["medians"]["RUN"]
    assert med[str(new.resolve())] == {"eager_ms": 11.0, "compiled_ms": 5.5, "eager_ratio": 1.0, "compiled_ratio": 1.0}
    assert med[str(old.resolve())]["eager_ratio"] == pytest.approx(21.0 / 11.0, abs=1e-3)
    saved = json.loads(out.read_text())
    assert saved["medians"] == result["medians"] and saved["command"].startswith("python bench/decode_step.py")


def test_a_source_that_is_not_a_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_bench("decode_step").main(["--run", "RUN", "--src", str(tmp_path)])
    assert exit_.value.code == 2 and "not a tokennet checkout" in capsys.readouterr().err
