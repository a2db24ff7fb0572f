"""bench/vqa_pieces.py: every piece is ``tokennet train vqa --set baselines=false`` with that piece's settings alone,
on the same seeds as the generic default, and the JSON holds each piece's medians; a missing run is one line."""

import json
import subprocess
from pathlib import Path

from support import load_bench


def _bench():
    return load_bench("vqa_pieces")


def test_each_piece_alone_on_the_same_seeds_and_its_medians_recorded(tmp_path, monkeypatch, capsys):
    bench = _bench()
    commands, real_run = [], subprocess.run

    def fake_train(cmd, **kwargs):  # stands for tokennet train: a score that counts the settings a run was given
        if "train" not in cmd:  # git, for the commit the JSON records
            return real_run(cmd, **kwargs)
        commands.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        score = 80.0 + len(cmd) + int(cmd[cmd.index("--seed") + 1])
        (out / "metrics.json").write_text(json.dumps({k: score for k in bench.KEYS}))

    monkeypatch.setattr(subprocess, "run", fake_train)
    out = tmp_path / "pieces.json"
    argv = ["--pieces", "generic", "stem", "sink", "--seeds", "0", "2", "--runs-dir", str(tmp_path / "runs"),
            "--parallel", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    assert len(commands) == 6
    for cmd in commands:
        sets = cmd[cmd.index("--set") + 1:]
        assert "baselines=false" in sets and "progress=false" in sets
        piece = Path(cmd[cmd.index("--out") + 1]).parent.name
        assert [s for s in sets if s not in ("baselines=false", "progress=false")] == bench.PIECES[piece]
    record = json.loads(out.read_text())
    assert record["seeds"] == [0, 2] and set(record["median"]) == {"generic", "stem", "sink"}
    generic, stem = record["median"]["generic"]["exact_match"], record["median"]["stem"]["exact_match"]
    assert stem - generic == len(bench.PIECES["stem"])  # the median over seeds 0 and 2 of each
    assert record["change_against_generic"]["stem"]["exact_match"] == stem - generic
    assert set(record["change_against_generic"]) == {"stem", "sink"} and "note" not in record
    assert "(+2.0)" in capsys.readouterr().out  # the stem's two settings, against generic


def test_a_failing_run_cancels_no_other_and_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    bench = _bench()
    trained, real_run = [], subprocess.run

    def fake_train(cmd, **kwargs):  # the mask's run fails as a refused setting would; the others finish
        if "train" not in cmd:
            return real_run(cmd, **kwargs)
        out = Path(cmd[cmd.index("--out") + 1])
        if out.parent.name == "mask":
            raise subprocess.CalledProcessError(2, cmd)
        trained.append(out.parent.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps({k: 90.0 for k in bench.KEYS}))

    monkeypatch.setattr(subprocess, "run", fake_train)
    out = tmp_path / "pieces.json"
    argv = ["--pieces", "generic", "mask", "sink", "points", "--seeds", "0", "--runs-dir", str(tmp_path / "runs"),
            "--parallel", "1", "--out", str(out)]
    assert bench.main(argv) == 2
    assert trained == ["generic", "sink", "points"]  # the runs queued after the failed one still ran
    err = capsys.readouterr().err.strip()
    assert "mask/seed0" in err and "sink" not in err and "\n" not in err and not out.exists()


def test_a_missing_run_is_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "pieces.json"
    argv = ["--pieces", "mask", "--seeds", "0", "--runs-dir", str(tmp_path / "none"), "--collect", "--out", str(out)]
    assert _bench().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "mask/seed0" in err and "\n" not in err and not out.exists()


def test_every_pieces_settings_are_ones_tokennet_train_vqa_accepts(capsys):
    """Each piece's ``--set`` words parse and land in the settings a run would train with (a piece whose value the
    CLI refused would cost hours of runs before the bench noticed)."""
    from tokennet.cli import main

    shown = {}
    for piece, sets in _bench().PIECES.items():
        assert main(["train", "vqa", "--show-settings", "--json", "--set", "baselines=false", *sets]) == 0, piece
        shown[piece] = json.loads(capsys.readouterr().out)
    assert shown["read_layers"]["read_layers"] == [1, 2] and shown["generic"]["read_layers"] is None
    assert shown["mask"]["modality_mask"] == "patch-local" and shown["generic"]["modality_mask"] == "full"
    assert shown["sink"]["sink"] is True and shown["points"]["answer_readout"] == "points"
