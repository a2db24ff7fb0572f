"""The multimodal task: one run, every modality — each input answered by its own task on its part of the model.

A multimodal model (:mod:`tokennet.models.multimodal`) is, per task, a complete single-task model whose trunk is
the shared one. :func:`part_run` views one task of a run as that task's own run (its part of the model, its data
spec, settings and metrics), so the language model's, the classifiers' and the graph task's verbs, pictures,
panels and bad-input checks apply unchanged: this module only routes.

:func:`cross_modal` measures what sharing the digit head does: whether the same digit, drawn, spoken or on the
sphere, gets the same answer, and whether the trunk's summary vectors of one modality find the same digit in another.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.sphere import SphereProjection
from ..errors import DataError, RunError, did_you_mean
from ..plugins import task_for
from ..tokens.graph import GraphBatch
from ..viz.explore.multimodal import MultimodalExplorer
from .base import HELP, Input, Task, as_paths, register_task, verb
from .example_files import Example, examples_command
from .language import LanguageModel

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["MultimodalTask", "part_run", "INPUT_OF", "DigitView", "digit_view", "cross_modal", "pair_agreement",
           "retrieval"]

# task → the `tokennet generate` input that feeds it, and the name its own task gives that input
INPUT_OF = {"text": ("prompt", "prompt"), "image": ("image", "image"), "audio": ("audio", "audio"),
            "sphere": ("sphere", "image"), "graph": ("graphs", "graphs")}
_AUDIO = (".wav", ".flac", ".ogg", ".mp3")


def part_run(run: Run, name: str) -> Run:
    """Task ``name`` of a multimodal run, as that task's own :class:`~tokennet.run.Run`."""
    from ..run import Run

    spec = run.data
    parts = getattr(spec, "parts", None)
    if not parts:
        raise RunError(f"{run.path} has no run.json saying which tasks it was trained on")
    if name not in parts:
        raise DataError(f"{run.path} was trained on {', '.join(parts)}; it has no {name!r} task")
    trained_part = parts[name]
    info = {"recipe": trained_part["recipe"], "settings": trained_part["settings"], "data_spec": trained_part["spec"]}
    metrics = run.metrics.get(name, {})
    model = run.model.part(name)
    return Run(run.path, model, run.tokenizer if name == "text" else None, info,
               metrics if isinstance(metrics, dict) else {}, task_for(model.config.family))


@register_task
class MultimodalTask(Task):
    """One trunk, several tasks: ``run.generate(prompt)`` continues text, ``run.classify(inputs, task=None)`` answers
    images, audio, sphere images or graphs with that task's head, ``run.predict(graphs)`` gives the graph head's
    outputs; ``tokennet generate`` takes any of ``--prompt``, ``--image``, ``--audio``, ``--sphere``, ``--graphs``."""

    name = "multimodal"
    kind = "multimodal"
    families = ("multimodal",)
    explorer = functools.partial(MultimodalExplorer, parts=part_run)  # each part through its own task's explorer
    inputs = (Input("prompt", HELP["prompt"], file=False, required=False),
              Input("image", HELP["image"], required=False),
              Input("audio", HELP["audio"], required=False),
              Input("sphere", "multimodal runs: image files to project onto the sphere and classify with the sphere "
                    "task", required=False),
              Input("graphs", "graph runs: JSON files of graphs", required=False))
    options = LanguageModel.options

    def trained(self, run: Run) -> list[str]:
        return list(run.model.tasks)

    def _need(self, run: Run, name: str, what: str) -> Run:
        if name not in self.trained(run):
            hint = did_you_mean(name, self.trained(run))
            raise DataError(f"{run.path} was trained on {', '.join(self.trained(run))}: it takes no {what} "
                            f"(no {name} task{'; ' + hint if hint else ''})")
        return part_run(run, name)

    # -- verbs ---------------------------------------------------------------------------------------------------
    @verb
    def generate(self, run: Run, prompt: str | list[str] = "\n", max_new_tokens: int = 200, **kw):
        """The text part's continuation of ``prompt`` (see :meth:`LanguageModel.generate`; ``include_prompt=True``:
        what ``tokennet generate --prompt`` prints)."""
        part = self._need(run, "text", "prompt")
        return part.task.generate(part, prompt, max_new_tokens, **kw)

    def task_of(self, run: Run, inputs) -> str:
        """Which task an input is for: graphs, audio files or waveforms ``(B, samples)``, signals on the sphere
        ``(B, C, M)``, or images (the image task, else the sphere task)."""
        if isinstance(inputs, GraphBatch):
            return "graph"
        if torch.is_tensor(inputs):
            kind = {2: "audio", 3: "sphere"}.get(inputs.dim(), "image")
        else:
            paths = [str(path).lower() for path in as_paths(inputs)]
            kind = "graph" if paths and all(path.endswith(".json") for path in paths) else \
                "audio" if paths and all(path.endswith(_AUDIO) for path in paths) else "image"
        if kind == "image" and "image" not in self.trained(run) and "sphere" in self.trained(run):
            kind = "sphere"
        return kind

    @verb
    def classify(self, run: Run, inputs, task: str | None = None) -> list[tuple[int, float]]:
        """``(class index, probability)`` per input, from the head of ``task`` (default: by the inputs' kind)."""
        name = task or self.task_of(run, inputs)
        if name == "text":
            raise RunError("the text task generates text (run.generate); it does not classify")
        part = self._need(run, name, f"{name} input")
        return part.task.classify(part, inputs)

    @verb
    def predict(self, run: Run, graphs) -> torch.Tensor:
        """The graph head's raw outputs ``(B, K)``: class logits, or a regression's values (see
        :meth:`~tokennet.tasks.graph.GraphPrediction.predict`). For a graph classifier ``tokennet generate --graphs``
        prints :meth:`classify`'s ``(class, probability)`` per graph, computed from these logits; a regression's
        values are what it prints."""
        part = self._need(run, "graph", "graphs")
        return part.task.predict(part, graphs)

    # -- the command line ----------------------------------------------------------------------------------------
    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """Each given input answered by its task (text continued; the others one line per input)."""
        given = [name for name, (flag, _) in INPUT_OF.items() if values.get(flag) not in (None, [], "")]
        if not given:
            flags = ", ".join("--" + INPUT_OF[name][0] for name in self.trained(run))
            raise DataError(f"a multimodal run takes an input of a task it was trained on: pass one of {flags} "
                            f"(held-out inputs to try: {examples_command(run.path)})")
        # all refused before any answer
        parts = {name: self._need(run, name, "--" + INPUT_OF[name][0]) for name in given}
        for name, part in parts.items():
            flag, theirs = INPUT_OF[name]
            mine = {inp.name for inp in part.task.inputs} | {option.name for option in part.task.options}
            yield from part.task.respond(part, {**{k: v for k, v in values.items() if k in mine},
                                                theirs: values[flag]})

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """Each task's own examples, in ``directory/<task>/`` (``text/prompt-0.txt``, ``image/image-0.png``, ...),
        with the flag this run takes them by (``--sphere`` for the sphere task's pictures)."""
        out = []
        for name in self.trained(run):
            part = part_run(run, name)
            task_dir = Path(directory) / name
            task_dir.mkdir(parents=True, exist_ok=True)
            flag, theirs = INPUT_OF[name]
            out += [Example({flag: example.values[theirs]}, example.label, example.files)
                    for example in part.task.examples(part, task_dir, count)]
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        out = []
        for name in self.trained(run):
            part = part_run(run, name)
            task_dir = Path(directory) / name
            task_dir.mkdir(parents=True, exist_ok=True)
            out += [({INPUT_OF[name][0]: v[INPUT_OF[name][1]]}, frag)
                    for v, frag in part.task.bad_inputs(part, task_dir)]
        missing = [name for name in INPUT_OF if name not in self.trained(run)]
        if missing:  # an input of a modality the run was not trained on: one line naming the ones it was
            flag = INPUT_OF[missing[0]][0]
            out.append(({flag: "x" if flag == "prompt" else [str(Path(directory) / "any.file")]}, "was trained on"))
        return out

    # -- pictures and the report ------------------------------------------------------------------------------------
    def viz_takes(self, run: Run) -> set[str]:
        """The ``tokennet viz`` options any of the run's trained tasks reads (each task's pictures take theirs)."""
        return set().union(*(part_run(run, t).task.viz_takes(part_run(run, t)) for t in self.trained(run)))

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """Each task's own pictures, for an input of that modality, in ``out_dir/<task>/``."""
        files = []
        for t in self.trained(run):
            part = part_run(run, t)
            files += part.task.draw(part, Path(out_dir) / t, **options)
        return files

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.multimodal import multimodal_panel

        return multimodal_panel(run, log, [(t, part_run(run, t)) for t in self.trained(run)])


# -- what the shared digit head does across modalities ---------------------------------------------------------------

@dataclass
class DigitView:
    """One digit task's held-out set as its part of the model sees it: ``labels (N,)``, the head's ``predictions
    (N,)`` and the trunk's ``summaries (N, D)`` (the pooled final tokens the shared head reads)."""

    labels: torch.Tensor
    predictions: torch.Tensor
    summaries: torch.Tensor


def _held_out(part: Run) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out inputs and labels of a digit task's part, as its own recipe evaluates them."""
    spec = part.data
    if isinstance(spec, SphereProjection):  # the test images projected onto the model's sample points, unrotated
        _, _, (images, labels) = spec.split()
        return spec.project(images, part.model.samples.cpu()), labels
    held = spec.held_out()
    return held.x_test, held.y_test


def digit_view(part: Run, batch_size: int = 256) -> DigitView:
    """Task ``part`` (a classifier's run, e.g. :func:`part_run`'s) on its held-out set: labels, predictions, summaries.

    The summary of an input is ``model.pool(model.forward_features(x))``: the vector the head reads (for the sphere's
    frame positions, in the first frame, where ``forward`` averages the head's answer over both)."""
    inputs, labels = _held_out(part)
    model = part.model
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    predictions, summaries = [], []
    try:
        with torch.no_grad():
            for i in range(0, len(labels), batch_size):
                x = inputs[i:i + batch_size].to(device)
                predictions.append(model(x).logits.argmax(-1).cpu())
                summaries.append(model.pool(model.forward_features(x)).float().cpu())  # (b, D)
    finally:
        model.train(was)
    return DigitView(labels.long().cpu(), torch.cat(predictions), torch.cat(summaries))


def pair_agreement(a: DigitView, b: DigitView, num_classes: int) -> tuple[float, float]:
    """Over every pair (an input of ``a``, an input of ``b``) of the same digit: the fraction whose predictions agree,
    and the fraction where both are that digit. Exact over all pairs: with ``c_a[d, k]`` the inputs of digit d that
    ``a`` calls k, agreeing pairs are ``Σ_d Σ_k c_a[d, k] c_b[d, k]`` out of ``Σ_d n_a[d] n_b[d]``."""
    def counts(view: DigitView) -> torch.Tensor:  # (K, K): true digit × predicted digit
        flat = view.labels * num_classes + view.predictions.long()
        return torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes).double()

    counts_a, counts_b = counts(a), counts(b)
    pairs = float((counts_a.sum(1) * counts_b.sum(1)).sum())
    if pairs == 0:
        raise DataError("the two held-out sets share no digit: there is no pair to compare")
    return (float((counts_a * counts_b).sum()) / pairs,
            float((counts_a.diagonal() * counts_b.diagonal()).sum()) / pairs)


def retrieval(query: DigitView, bank: DigitView) -> tuple[float, float]:
    """How often a summary of ``query`` finds its own digit among ``bank``'s: ``(nearest, class_mean)`` accuracies.

    Both use cosine similarity after each modality's vectors are centred on their own mean (no labels): a constant
    offset between modalities would otherwise dominate the cosine and say nothing about the digit. ``nearest``: the
    label of the most similar bank vector; ``class_mean``: the most similar of the bank's per-digit mean vectors."""
    def unit(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, dim=-1)

    q = unit(query.summaries.double() - query.summaries.double().mean(0))  # (Nq, D)
    k = unit(bank.summaries.double() - bank.summaries.double().mean(0))  # (Nb, D)
    nearest = bank.labels[(q @ k.T).argmax(1)]  # (Nq,)
    digits = bank.labels.unique()  # (C,) the digits the bank holds
    means = unit(torch.stack([k[bank.labels == digit].mean(0) for digit in digits]))  # (C, D)
    by_mean = digits[(q @ means.T).argmax(1)]  # (Nq,)
    return float((nearest == query.labels).double().mean()), float((by_mean == query.labels).double().mean())


def cross_modal(run: Run, batch_size: int = 256) -> dict[str, dict[str, float]]:
    """What the shared digit head does across the modalities of a multimodal run, on their held-out sets.

    Returns ``{"agreement": {"a_b": …}, "both_right": {"a_b": …}, "nearest": {"a_to_b": …}, "class_mean":
    {"a_to_b": …}}`` for the tasks that share the head (``config.shared_head`` and trained): :func:`pair_agreement`
    per pair of tasks, :func:`retrieval` per ordered pair (``a``'s summaries query ``b``'s).

    Raises:
        DataError: fewer than two trained tasks share the head.
    """
    model = run.model
    shared = [t for t in getattr(model.config, "shared_head", []) if t in model.tasks]
    if len(shared) < 2:
        raise DataError(f"{run.path}: cross-modal agreement needs two tasks sharing the digit head; it has "
                        f"{', '.join(shared) or 'none'}")
    views = {t: digit_view(part_run(run, t), batch_size) for t in shared}
    num_classes = int(model.part(shared[0]).config.num_classes)
    out: dict[str, dict[str, float]] = {"agreement": {}, "both_right": {}, "nearest": {}, "class_mean": {}}
    for first, second in itertools.combinations(shared, 2):
        pair = f"{first}_{second}"
        out["agreement"][pair], out["both_right"][pair] = pair_agreement(views[first], views[second], num_classes)
    for query, bank in itertools.permutations(shared, 2):
        direction = f"{query}_to_{bank}"
        out["nearest"][direction], out["class_mean"][direction] = retrieval(views[query], views[bank])
    return out
