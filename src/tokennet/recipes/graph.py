"""Recipe ``graph``: nodes as tokens on a task that only structure can solve, with the position ablation.

Data: the embedded generator of :mod:`tokennet.data.graphs` — random connected graphs with two marked
nodes; the label is their shortest-path distance (1, 2, …, 6+). Node features only say which nodes are
marked, so attention over the node tokens alone is a set model, blind to the answer.

The run trains the configured model (a few minutes) and, with ``ablation=true``, the same model with each
other way of giving attention the structure — no positions, Laplacian eigenvector positions, random-walk
positions, commute-time positions ``u_k/√λ_k`` of ``D − A``, the spectral-kernel bias ``V φ(Λ) Vᵀ``
(relative positions from the Laplacian's eigenpairs, sign- and basis-invariant), an adjacency mask, a
shortest-path distance bias (Graphormer) — for the same steps on the same batches, and writes the table
to ``metrics.json`` as ``ablation``: the lecture's claim ("attention alone is blind to structure; the
Laplacian gives it back"), measured. ``test_accuracy`` is the configured model's, and ``variant`` names
it (a row of the table).

The default model is the best row of that table: full attention with the spectral-kernel bias over all
``pe_dim=16`` eigenpairs (800 steps). The table and why raw eigenvectors carry nothing here:
``docs/experiments/graph.md``.

``--data qm9`` (or a directory with QM9's CSV files): real molecules from the PyPI package ``qm9pack``,
atoms as tokens, bonds from interatomic distances; the target (``--set target=homo_lumo_gap``, any of
:data:`~tokennet.data.qm9.TARGETS`) is regressed with an L1 loss on the standard random split
(110k / 10k / rest, seeded). The profile uses the bond graph's Laplacian positions *and* a bias from the
3-D distances (``attention=distance-3d``); ``--set attention=full`` keeps only the 2-D structure.
``metrics.json``: ``test_mae`` (``test_mae_ev`` for energies), next to in-run baselines: the mean
predictor and a linear model on atom-type counts.

The profile trains with Muon for 20 minutes; measured (``python bench/graph.py --qm9``):
``docs/experiments/graph.md``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..data.graphs import MarkedDistance
from ..data.qm9 import QM9Targets, is_qm9
from ..errors import DataError, RecipeError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model
from ..train.trainer import Trainer

__all__ = ["VARIANTS", "evaluate_graphs"]

log = logging.getLogger(__name__)

# name → (attention, position)
VARIANTS = {
    "set model (no structure)": ("full", "none"),
    "Laplacian positions": ("full", "laplacian"),
    "random-walk positions": ("full", "random-walk"),
    "adjacency mask": ("adjacency", "none"),
    "commute-time positions": ("full", "commute-time"),
    "spectral-kernel bias": ("full", "spectral-kernel"),
    "distance bias (Graphormer)": ("distance-bias", "none"),
}


def variant_name(config) -> str:
    """The ablation row a model is (``attention=…, position=…`` for a combination outside the table)."""
    for name, pair in VARIANTS.items():
        if pair == (config.attention, config.position):
            return name
    return f"attention={config.attention}, position={config.position}"


@torch.no_grad()
def evaluate_graphs(model, batch, labels, batch_size: int = 500) -> dict[str, float]:
    """Accuracy and mean cross-entropy over a collated set, in chunks."""
    dev = next(model.parameters()).device
    correct, loss, n = 0, 0.0, len(labels)
    for i in range(0, n, batch_size):
        idx = torch.arange(i, min(n, i + batch_size))
        out = model(batch.select(idx).to(dev)).logits.float()
        y = labels[idx].to(dev)
        correct += int((out.argmax(-1) == y).sum())
        loss += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
    return {"test_accuracy": correct / max(1, n), "test_loss": loss / max(1, n)}


def data_defaults(data) -> dict[str, Any]:
    """QM9's profile (molecule regression) replaces the generated task's defaults; other data: none."""
    if data in (None, "", "embedded"):
        return {}
    if not is_qm9(data):
        raise DataError(f"the graph recipe takes its embedded generator or QM9 (qm9, or a directory with "
                        f"qm9_part1..3.csv), got {data!r}")
    return {"node_features": 5, "task": "regress", "num_outputs": 1, "attention": "distance-3d",
            "position": "laplacian", "pe_dim": 8, "dim": 128, "num_layers": 4, "num_heads": 8, "max_distance": 8,
            "max_iters": 200_000, "time_budget": 1200.0, "batch_size": 64, "lr": 5e-4, "warmup_iters": 500,
            "eval_interval": 2000, "weight_decay": 0.01, "ablation": False, "val_size": 10_000, "test_size": 0,
            # Muon for the hidden matrices (AdamW at lr for the rest): validation MAE 0.182 eV against
            # AdamW's 0.584 after 2000 steps each (one thread)
            "optimizer": "muon"}


@torch.no_grad()
def evaluate_regression(model, batch, y, batch_size: int = 500) -> float:
    """Mean absolute error (in the target's units) over a collated set, in chunks."""
    dev = next(model.parameters()).device
    err, n = 0.0, len(y)
    for i in range(0, n, batch_size):
        idx = torch.arange(i, min(n, i + batch_size))
        err += float((model(batch.select(idx).to(dev)).logits.float().cpu() - y[idx]).abs().sum())
    return err / max(1, n)


def _mae_metrics(mae: float, target: str, prefix: str = "test") -> dict[str, float]:
    from ..data.qm9 import HARTREE_EV, TARGETS

    out = {f"{prefix}_mae": mae}
    if TARGETS[target][1] == HARTREE_EV:
        out[f"{prefix}_mae_ev"] = mae
    return out


def _baselines(mols, tr, te, y) -> dict[str, float]:
    """The mean predictor and least squares on atom-type counts (+ a constant), fitted on the training set."""
    import numpy as np

    from ..data.qm9 import ELEMENTS

    counts = np.stack([(mols.z == elem).sum(1) for elem in range(len(ELEMENTS))], axis=1).astype(np.float64)
    design = np.concatenate([counts, np.ones((len(counts), 1))], axis=1)
    target = y[:, 0].double().numpy()
    coef, *_ = np.linalg.lstsq(design[tr.numpy()], target[tr.numpy()], rcond=None)
    return {"baseline_mean_mae": float(np.abs(target[te.numpy()] - target[tr.numpy()].mean()).mean()),
            "baseline_linear_counts_mae": float(np.abs(design[te.numpy()] @ coef - target[te.numpy()]).mean())}


def _build_qm9(ctx: BuildContext, spec: QM9Targets) -> Job:
    from ..data.qm9 import MoleculeBatches

    train = ctx.train
    mols = spec.molecules()
    train_idx, val_idx, test_idx = spec.split(mols)
    y = spec.targets(mols)
    val, val_y = spec.collate(mols, val_idx), y[val_idx]
    over = {**ctx.model, "task": "regress", "num_outputs": 1, "target_mean": float(y[train_idx].mean()),
            "target_std": float(y[train_idx].std())}
    torch.manual_seed(train.seed)
    model = create_model("graph-small", **over)
    src = MoleculeBatches(mols, train_idx, train.batch_size, spec.target, seed=train.seed, pe_dim=spec.pe_dim,
                          max_distance=spec.max_distance)
    log.info("qm9: %d train / %d val / %d test molecules, target %s; %.3fM parameters", len(train_idx), len(val_idx),
             len(test_idx), spec.target, model.num_parameters() / 1e6)

    def evaluate(m) -> dict[str, float]:
        mae = evaluate_regression(m, val, val_y)
        return {"val_loss": mae / m.config.target_std, **_mae_metrics(mae, spec.target, "val")}

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        return {"target": spec.target, "train_size": len(train_idx), **_baselines(mols, train_idx, test_idx, y)}

    return Job(model=model.to(ctx.device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               finish=finish, data=spec)


def make_data(source: str | None, settings: dict[str, Any]):
    """The generated task's spec, or QM9's, by ``--data`` (the recipe's declared spec is the generated task's)."""
    if is_qm9(source):
        return QM9Targets.from_settings(source, settings)
    if source not in (None, "", "embedded"):
        data_defaults(source)  # the one-line error naming what the recipe takes
    return MarkedDistance.from_settings(None, settings)


def build(ctx: BuildContext) -> Job:
    spec = ctx.data
    if isinstance(spec, QM9Targets):
        return _build_qm9(ctx, spec)
    train, model_overrides, device, options = ctx.train, ctx.model, ctx.device, ctx.options
    val, val_y = spec.val()
    test, test_y = spec.held_out()
    torch.manual_seed(train.seed)
    model = create_model("graph-small", **model_overrides)
    src = spec.train_source(train.batch_size)
    log.info("graph: %s attention, %s positions, %.3fM parameters", model.config.attention, model.config.position,
             model.num_parameters() / 1e6)

    def evaluate(m) -> dict[str, float]:
        scores = evaluate_graphs(m, val, val_y)
        return {"val_accuracy": scores["test_accuracy"], "val_loss": scores["test_loss"]}

    def finish(m) -> dict[str, Any]:
        out: dict[str, Any] = {"variant": variant_name(m.config)}
        if options["ablation"]:
            out["ablation"] = _ablation(model_overrides, train, src, test, test_y, device, m)
        return out

    return Job(model=model.to(device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               finish=finish)


def _ablation(model_overrides, train, src, test, test_y, device, trained) -> dict[str, float]:
    """Test accuracy of every structural variant, each trained like the configured model (same steps,
    batches and seed); the configured model's own figure is reused, not retrained."""
    import dataclasses
    import tempfile

    config = trained.config
    table = {}
    steps = dataclasses.replace(train, time_budget=None, eval_interval=0, checkpoint_interval=0, progress=False,
                                log_interval=0, report=False, tensorboard=False)
    for name, (attention, position) in VARIANTS.items():
        if (attention, position) == (config.attention, config.position):
            table[name] = evaluate_graphs(trained, test, test_y)["test_accuracy"]
            continue
        torch.manual_seed(train.seed)
        m = create_model("graph-small", **{**model_overrides, "attention": attention, "position": position})
        with tempfile.TemporaryDirectory() as scratch:  # the variants' checkpoints are not part of the run
            Trainer(m.to(device), steps, src, out_dir=scratch, device=device, label=f"ablation {name}").fit()
        table[name] = evaluate_graphs(m, test, test_y)["test_accuracy"]
        log.info("ablation: %-28s test accuracy %.4f", name, table[name])
    return table


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: the run's test metrics (accuracy on held-out graphs, or MAE on held-out molecules)."""
    if data is not None:
        raise RecipeError("the graph recipe evaluates on the run's own held-out split; it takes no other data")
    test, test_y = run.data.held_out()
    if isinstance(run.data, QM9Targets):
        mae = evaluate_regression(run.model, test, test_y)
        return {**_mae_metrics(mae, run.data.target), "test_size": len(test_y)}
    return {**evaluate_graphs(run.model, test, test_y), "test_size": len(test_y)}


def unused(settings: dict[str, Any]) -> set[str]:
    """QM9's settings (``target``, ``train_size``) do not apply to the generated task; its ablation does not
    apply to QM9 (it is not computed there)."""
    return set() if settings.get("task") == "regress" else {"target", "train_size"}


register_recipe(Recipe(
    name="graph",
    description="graph transformer on a structure-only task (distance between two marked nodes); "
    "ablation=true adds the positions / mask / distance-bias table",
    model="graph-small",
    build=build,
    data=MarkedDistance,
    make_data=make_data,
    option_help={
        "ablation": "also train the same model with every other way of giving attention the structure; report the "
                    "table",
        "target": "QM9 only: the molecular property to regress (e.g. homo_lumo_gap)",
        "train_size": "QM9 only: molecules in the training split",
    },
    options={"ablation": False, "target": "homo_lumo_gap", "train_size": 110_000},  # the table: --set ablation=true
    # the best row of the ablation (see the module docstring)
    model_defaults={"node_features": 2, "num_outputs": 6, "task": "classify", "position": "spectral-kernel",
                    "pe_dim": 16},
    train_defaults={"max_iters": 800, "batch_size": 64, "lr": 1e-3, "warmup_iters": 100, "eval_interval": 400,
                    "weight_decay": 0.01},
    evaluate_run=evaluate_run,
    headline=("test_accuracy", "test_mae"),
    baselines={"mean target": (None, "baseline_mean_mae"),
               "linear on atom counts": (None, "baseline_linear_counts_mae")},
    data_defaults=data_defaults,
    unused=unused,
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 64, "val_size": 16,
           "ablation": False},
))
