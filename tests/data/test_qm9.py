"""QM9 reading (a tiny directory in QM9's CSV format, written here), bonds from geometry, the split,
the `graph --data DIR` QM9 profile end to end, and bad input."""

import csv
import json

import numpy as np
import pytest
import torch

from tokennet.cli import main
from tokennet.data.qm9 import HARTREE_EV, PARTS, TARGETS, bonds, find_qm9, load_qm9, molecule_batch, split_indices
from tokennet.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")

METHANE = (["C", "H", "H", "H", "H"], [[-0.0127, 1.0858, 0.0080], [0.0022, -0.0060, 0.0020], [1.0117, 1.4638, 0.0003],
                                       [-0.5408, 1.4475, -0.8766], [-0.5238, 1.4379, 0.9064]])
WATER = (["O", "H", "H"], [[0.0, 0.0, 0.0], [0.757, 0.586, 0.0], [-0.757, 0.586, 0.0]])
AMMONIA = (["N", "H", "H", "H"], [[-0.0404, 1.0241, 0.0626], [0.0173, 0.0125, -0.0274], [0.9158, 1.3587, -0.0288],
                                  [-0.5203, 1.3435, -0.7755]])
HF = (["F", "H"], [[0.0, 0.0, 0.0], [0.0, 0.0, 0.917]])
MOLECULES = [METHANE, WATER, AMMONIA, HF]


def write_qm9(d, count=24, truncate=False):
    """QM9's three CSV parts with ``count`` molecules; the gap grows with the number of hydrogens (learnable)."""
    d.mkdir(parents=True, exist_ok=True)
    cols = ["XYZ_file", "Elements", "XYZ_Ang", *(c for c, _ in TARGETS.values())]
    rows = []
    for i in range(count):
        el, xyz = MOLECULES[i % 4]
        gap = 0.2 + 0.05 * el.count("H") + 0.001 * i
        values = {c: 0.1 * i + 1 for c, _ in TARGETS.values()}
        values["HOMO_LUMO_gap_au"] = gap
        text = json.dumps(xyz) if el != HF[0] else "[[0.,0.,0.],[0.,0.,0.917]]"  # QM9 writes "0." (not JSON)
        rows.append({"XYZ_file": f"m{i}.xyz", "Elements": str(el), "XYZ_Ang": text, **values})
    for k, name in enumerate(PARTS):
        with open(d / name, "w", newline="") as f:
            w = csv.DictWriter(f, cols)
            w.writeheader()
            w.writerows(rows[k::3])
    if truncate:
        text = (d / PARTS[1]).read_text()
        (d / PARTS[1]).write_text(text[: len(text) - 40])
    return d


def test_reads_molecules_targets_in_ev_and_bonds(tmp_path):
    mols = load_qm9(write_qm9(tmp_path / "q"), cache=False)
    assert len(mols) == 24 and mols.z.shape == (24, 29) and mols.pos.shape == (24, 29, 3)
    first = [i for i in range(24) if mols.n[i] == 5][0]  # a methane
    assert sorted(mols.n[:4].tolist()) == [2, 3, 4, 5]
    assert mols.y["homo_lumo_gap"][first] == pytest.approx((0.2 + 0.05 * 4 + 0.001 * first) * HARTREE_EV)
    assert bonds(mols.z[first], mols.pos[first], 5) == [(0, 1), (0, 2), (0, 3), (0, 4)]  # C–H only, no H–H
    water = [i for i in range(24) if mols.n[i] == 3][0]
    assert bonds(mols.z[water], mols.pos[water], 3) == [(0, 1), (0, 2)]
    g = molecule_batch(mols, np.array([first, water]), pe_dim=4)
    assert g.x.shape == (2, 5, 5) and g.pos.shape == (2, 5, 3)
    assert g.node_mask.sum(1).tolist() == [5, 3] and int(g.adj[0].sum()) == 8


def test_cache_round_trip_and_split(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path / "cache"))
    d = write_qm9(tmp_path / "q")
    a = load_qm9(d)
    assert len(list((tmp_path / "cache").glob("qm9-*.npz"))) == 1
    b = load_qm9(d)
    assert np.array_equal(a.z, b.z) and np.array_equal(a.y["u0"], b.y["u0"])
    tr, va, te = split_indices(130_831, seed=0)
    assert (len(tr), len(va), len(te)) == (110_000, 10_000, 10_831)
    assert len(set(tr.tolist()) | set(va.tolist()) | set(te.tolist())) == 130_831
    assert torch.equal(split_indices(130_831, seed=0)[0], tr) and not torch.equal(split_indices(130_831, 1)[0], tr)


def test_bad_qm9_input_is_one_clear_error(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install qm9pack"):
        find_qm9()
    with pytest.raises(DataError, match="does not exist"):
        load_qm9(tmp_path / "nope")
    d = write_qm9(tmp_path / "q")
    (d / PARTS[2]).unlink()
    with pytest.raises(DataError, match="qm9_part3.csv is missing"):
        load_qm9(d)
    with pytest.raises(DataError, match="truncated or damaged"):
        load_qm9(write_qm9(tmp_path / "t", truncate=True), cache=False)


def test_graph_recipe_on_a_qm9_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path / "cache"))
    d = write_qm9(tmp_path / "q", count=60)
    out = tmp_path / "run"
    sets = ["dim=16", "num_layers=1", "num_heads=2", "batch_size=8", "eval_interval=0", "warmup_iters=1"]
    assert main(["-q", "train", "graph", "--data", str(d), "--out", str(out), "--max-iters", "4",
                 "--no-progress", "--set", *sets]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["target"] == "homo_lumo_gap" and m["test_mae_ev"] > 0 and m["test_mae"] == m["test_mae_ev"]
    assert m["baseline_linear_counts_mae"] < m["baseline_mean_mae"]  # the gap follows the atom counts here
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["test_mae_ev"] == pytest.approx(m["test_mae_ev"], rel=1e-6)
    assert main(["-q", "train", "graph", "--data", str(d), "--out", str(tmp_path / "x"), "--set", "target=gap"]) == 2
    assert "unknown QM9 target 'gap'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
