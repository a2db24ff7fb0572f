"""QM9: 130,831 small organic molecules (C, H, N, O, F; up to 29 atoms) with DFT-computed properties.

Ramakrishnan et al. 2014 (https://doi.org/10.1038/sdata.2014.22). The PyPI package ``qm9pack`` (MIT)
ships the data as CSV files (``qm9_part1..3.csv``: elements, 3-D coordinates in Å, the standard
targets); they are read here directly — the package's own loader imports ``pkg_resources`` and pandas.
The parsed arrays are cached once as ``.npz`` (no pickle) next to nothing the user owns:
``~/.cache/tokennet/`` (or ``$TOKENNET_CACHE``).

Atoms are the tokens. Bonds come from geometry — atoms ``i, j`` are bonded when
``|r_i − r_j| < 1.15 · (ρ_i + ρ_j)`` with covalent radii ρ (Cordero et al. 2008) — so no RDKit is needed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from .. import jsonio
from ..errors import DataError
from ..tokens.graph import GraphBatch, collate_graphs
from .spec import DataSpec, register_data
from .spoken_digits import _save_npz

__all__ = ["ELEMENTS", "TARGETS", "HARTREE_EV", "Molecules", "find_qm9", "load_qm9", "bonds", "molecule_batch",
           "MoleculeBatches", "split_indices", "QM9Targets", "is_qm9"]

ELEMENTS = ("H", "C", "N", "O", "F")
COVALENT_RADIUS = {"H": 0.31, "C": 0.76, "N": 0.71, "O": 0.66, "F": 0.57}  # Å, Cordero et al. 2008
BOND_TOLERANCE = 1.15
HARTREE_EV = 27.211386245988
MAX_ATOMS = 29
# name → (CSV column, factor to the reported unit)
TARGETS = {
    "homo_lumo_gap": ("HOMO_LUMO_gap_au", HARTREE_EV),  # eV
    "homo": ("HOMO_au", HARTREE_EV),  # eV
    "lumo": ("LUMO_au", HARTREE_EV),  # eV
    "u0": ("InternalEnergy_0K_au", HARTREE_EV),  # eV
    "zpve": ("ZPVE_au", HARTREE_EV),  # eV
    "dipole": ("Dipole_debye", 1.0),  # debye
    "r2": ("R2_bohr2", 1.0),  # bohr²
    "cv": ("Heatcapacity_Cv_cal_mol_K", 1.0),  # cal/(mol K)
}
PARTS = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
_TRAILING_DOT = re.compile(r"(?<=\d)\.(?=[,\]\s])")  # Fortran-style "1." is not JSON: read it as "1.0"


@dataclass
class Molecules:
    """Padded molecules: element indices ``z`` ``(M, 29)`` into :data:`ELEMENTS` (−1 at padding), positions
    ``pos`` ``(M, 29, 3)`` in Å, atom counts ``n`` ``(M,)`` and every target ``y[name]`` ``(M,)``."""

    z: np.ndarray
    pos: np.ndarray
    n: np.ndarray
    y: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.n)


def find_qm9(path: str | Path | None = None) -> Path:
    """The directory holding ``qm9_part1..3.csv``: ``path``, else the installed ``qm9pack`` package's data."""
    if path not in (None, "", "qm9"):
        directory = Path(path)
        if not directory.is_dir():
            raise DataError(f"QM9 directory {directory} does not exist")
        return directory
    import importlib.util

    spec = importlib.util.find_spec("qm9pack")  # found without importing it (its loader needs pkg_resources)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("QM9 is not installed: pip install qm9pack (or give a directory with qm9_part1..3.csv)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _cache_file(directory: Path) -> Path:
    key = hashlib.sha256()
    for name in PARTS:
        part_file = directory / name
        stat = part_file.stat()
        key.update(f"{part_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    root = Path(os.environ.get("TOKENNET_CACHE", Path.home() / ".cache" / "tokennet"))
    return root / f"qm9-{key.hexdigest()[:16]}.npz"


def _parse(directory: Path) -> Molecules:
    z, pos, n, target_values = [], [], [], {k: [] for k in TARGETS}
    for name in PARTS:
        part_file = directory / name
        with open(part_file, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [column for column in ("Elements", "XYZ_Ang", *(column for column, _ in TARGETS.values()))
                       if column not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{part_file} is not a QM9 file: no column {missing[0]!r}")
            for row in reader:
                where = f"{part_file}:{reader.line_num}"
                try:
                    elements = jsonio.loads(row["Elements"].replace("'", '"'), what=where)
                    xyz = np.asarray(jsonio.loads(_TRAILING_DOT.sub(".0", row["XYZ_Ang"]), what=where),
                                     dtype=np.float32)
                    values = {k: float(row[column]) * scale for k, (column, scale) in TARGETS.items()}
                except (TypeError, ValueError, AttributeError, json.JSONDecodeError):
                    raise DataError(f"{where}: a molecule that cannot be read (the file is truncated or "
                                    "damaged; reinstall qm9pack)") from None
                if not 0 < len(elements) <= MAX_ATOMS or xyz.shape != (len(elements), 3) \
                        or any(element not in COVALENT_RADIUS for element in elements):
                    raise DataError(f"{where}: a molecule with bad elements or coordinates")
                k = len(elements)
                atom_types = np.full(MAX_ATOMS, -1, dtype=np.int8)
                atom_types[:k] = [ELEMENTS.index(element) for element in elements]
                atom_pos = np.zeros((MAX_ATOMS, 3), dtype=np.float32)
                atom_pos[:k] = xyz
                z.append(atom_types)
                pos.append(atom_pos)
                n.append(k)
                for key, v in values.items():
                    target_values[key].append(v)
    if not n:
        raise DataError(f"{directory} holds no molecules")
    return Molecules(np.stack(z), np.stack(pos), np.asarray(n, dtype=np.int64),
                     {k: np.asarray(v, dtype=np.float64) for k, v in target_values.items()})


def load_qm9(path: str | Path | None = None, *, cache: bool = True) -> Molecules:
    """Read QM9 (see :func:`find_qm9`), from the ``.npz`` cache after the first time."""
    directory = find_qm9(path)
    absent = [part for part in PARTS if not (directory / part).is_file()]
    if absent:
        raise DataError(f"{directory} is not a complete QM9 directory: {absent[0]} is missing "
                        "(pip install --force-reinstall qm9pack)")
    cache_path = _cache_file(directory)
    if cache and cache_path.is_file():
        with np.load(cache_path, allow_pickle=False) as cached:
            return Molecules(cached["z"], cached["pos"], cached["n"], {k: cached[f"y_{k}"] for k in TARGETS})
    mols = _parse(directory)
    if cache:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        # atomic: a private temporary beside the cache, fsynced, renamed into place (no fixed name to collide on)
        _save_npz(cache_path, z=mols.z, pos=mols.pos, n=mols.n, **{f"y_{k}": v for k, v in mols.y.items()})
    return mols


def bonds(z: np.ndarray, pos: np.ndarray, n: int) -> list[tuple[int, int]]:
    """Bonded atom pairs ``i < j`` of one molecule, from distances and covalent radii."""
    radius = np.asarray([COVALENT_RADIUS[ELEMENTS[element]] for element in z[:n]])
    distance = np.linalg.norm(pos[:n, None] - pos[None, :n], axis=-1)  # (n, n)
    close = distance < BOND_TOLERANCE * (radius[:, None] + radius[None, :])
    i, j = np.nonzero(np.triu(close, k=1))
    return list(zip(i.tolist(), j.tolist(), strict=True))


def molecule_batch(mols: Molecules, index, *, pe_dim: int = 8, max_distance: int = 8) -> GraphBatch:
    """Molecules ``index`` as one :class:`GraphBatch`: atoms one-hot over :data:`ELEMENTS`, bonds as edges,
    3-D positions in ``pos``."""
    idx = np.asarray(index)
    graphs = []
    for m in idx:
        k = int(mols.n[m])
        x = torch.nn.functional.one_hot(torch.from_numpy(mols.z[m, :k].astype(np.int64)), len(ELEMENTS)).float()
        graphs.append((x, bonds(mols.z[m], mols.pos[m], k)))
    batch = collate_graphs(graphs, k=pe_dim, rw_steps=pe_dim, max_distance=max_distance)
    N = batch.x.shape[1]
    batch.pos = torch.from_numpy(mols.pos[idx, :N]).clone()
    return batch


def split_indices(count: int, seed: int, train: int = 110_000, val: int = 10_000) -> tuple[Tensor, Tensor, Tensor]:
    """The standard random split (110k / 10k / the rest), seeded; smaller sets keep the same proportions."""
    if count < 3:
        raise DataError(f"QM9 split needs at least 3 molecules, got {count}")
    if count < train + val + 1:  # a small directory: the standard proportions
        train, val = max(1, int(count * 0.84)), max(1, int(count * 0.076))
    perm = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return perm[:train], perm[train:train + val], perm[train + val:]


class MoleculeBatches:
    """Batch source for the trainer: epochs over the training molecules, shuffled per epoch from the seed."""

    def __init__(self, mols: Molecules, train_idx: Tensor, batch_size: int, target: str, seed: int = 0, *,
                 pe_dim: int = 8, max_distance: int = 8):
        self.mols, self.idx, self.batch_size, self.target, self.seed = mols, train_idx, batch_size, target, seed
        self.kw = dict(pe_dim=pe_dim, max_distance=max_distance)
        self.steps_per_epoch = max(1, len(train_idx) // batch_size)

    def batch(self, index: int) -> tuple[GraphBatch, Tensor]:
        epoch, step = divmod(index, self.steps_per_epoch)
        perm = torch.randperm(len(self.idx), generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        rows = self.idx[perm[step * self.batch_size:(step + 1) * self.batch_size]].numpy()
        y = torch.from_numpy(self.mols.y[self.target][rows]).float()[:, None]
        return molecule_batch(self.mols, rows, **self.kw), y


def is_qm9(data: str | None) -> bool:
    """Whether a ``--data`` value names QM9: ``qm9``, or a directory holding ``qm9_part1.csv``."""
    return data == "qm9" or (data not in (None, "", "embedded") and (Path(data) / PARTS[0]).is_file())


@register_data
@dataclasses.dataclass
class QM9Targets(DataSpec):
    """QM9 regression: one ``target`` of :data:`TARGETS`, the standard random split (``train_size`` /
    ``val_size`` / the rest, by ``seed``; ``test_size`` > 0 keeps only the first that many test molecules),
    molecules collated with ``pe_dim`` bond-graph Laplacian positions and hops capped at ``max_distance``.

    Args:
        source: ``qm9`` (the installed qm9pack package's copy) or a directory of ``qm9_part1..3.csv``.
        target: the molecular property to predict, one of :data:`TARGETS`.
        seed: draws the random split.
        train_size: molecules in the training set (QM9 with ``--data qm9``).
        val_size: molecules in the validation set.
        test_size: keep only the first this many test molecules (0: every one left).
        pe_dim: bond-graph Laplacian position features per atom.
        max_distance: bond hops the attention bias tells apart (farther ones share the last).
    """

    kind: ClassVar[str] = "qm9"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("graph",)
    source: str = "qm9"
    target: str = "homo_lumo_gap"
    seed: int = 0
    train_size: int = 110_000
    val_size: int = 10_000
    test_size: int = 0
    pe_dim: int = 8
    max_distance: int = 8

    def __post_init__(self):
        if self.target not in TARGETS:
            raise DataError(f"unknown QM9 target {self.target!r}; one of: {', '.join(TARGETS)}")

    @classmethod
    def from_legacy(cls, data, settings):
        return cls.from_settings(data, settings) if is_qm9(data) else None

    def molecules(self) -> Molecules:
        return load_qm9(None if self.source == "qm9" else self.source)

    def split(self, mols: Molecules) -> tuple[Tensor, Tensor, Tensor]:
        """``(train, val, test)`` molecule indices."""
        train, val, test = split_indices(len(mols), self.seed, self.train_size, self.val_size)
        return train, val, test[: self.test_size] if self.test_size > 0 else test

    def targets(self, mols: Molecules) -> Tensor:
        """The target of every molecule ``(M, 1)``, in the reported unit."""
        return torch.from_numpy(mols.y[self.target]).float()[:, None]

    def collate(self, mols: Molecules, index: Tensor) -> GraphBatch:
        return molecule_batch(mols, index.numpy(), pe_dim=self.pe_dim, max_distance=self.max_distance)

    def held_out(self) -> tuple[GraphBatch, Tensor]:
        """The test molecules, collated, and their targets ``(n, 1)``."""
        mols = self.molecules()
        test = self.split(mols)[2]
        return self.collate(mols, test), self.targets(mols)[test]
