"""Which head does which job: every head of a trained run ablated in turn, and what the model got worse at.

The lecture: *"I can have k attention layers in parallel, and then I can aggregate them. And each attention layer
can be attending to different things. One can learn to attend to shapes and one can learn to attend to textures,
for example."* If the heads have different jobs, taking one away hurts some questions and not others.
:func:`head_jobs` measures, for each layer ℓ and head h of a run:

- **the metric per group with the head ablated** (:mod:`tokennet.attention.ablation`: its output zeroed, or replaced
  by its mean output over the evaluated examples): for a question-answering run (``vqa``) the exact match (%) per
  question template on the first ``limit`` held-out questions; for a language model the loss (nats per token) on
  the first ``limit`` windows of its held-out text, overall and by the kind of character it predicts;
- **its cost** per group: how much worse the metric got — accuracy points lost, or nats of loss gained;
- **its mean attention distance**: pixels between patch centres (vqa: a patch's attention to the other patches,
  :func:`~tokennet.tasks.vqa_heads.head_statistics`), or tokens back (a language model: ``Σ_j A_ij (i − j)``);
- for vqa, **what the summary token attends to** with that head (:func:`~tokennet.tasks.vqa_heads.summary_targets`).

A head is *necessary* for a group when ablating it costs more than a threshold (:data:`THRESHOLDS`: 5 accuracy
points, or 0.05 nats): :meth:`HeadJobs.necessary`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..attention.ablation import ABLATIONS, ablated_head, recorded_means, self_attention_layers
from ..errors import ConfigError, DataError, RunError
from .heads_probes import QuestionProbe, TextProbe

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["HeadJob", "HeadJobs", "head_jobs", "THRESHOLDS", "DEFAULT_LIMITS", "check_heads"]

THRESHOLDS = {"vqa": 5.0, "language-model": 0.05}  # a cost above this: the head is necessary for that group
DEFAULT_LIMITS = {"vqa": 1000, "language-model": 32}  # held-out questions; windows of text
PROBES = {"vqa": QuestionProbe, "language-model": TextProbe}


@dataclass
class HeadJob:
    """One head: the metric per group with it ablated, the cost of that, how far it looks and what the question's
    summary token attends to through it (vqa)."""

    layer: int
    head: int
    scores: dict[str, float]
    cost: dict[str, float]
    distance: float | None = None
    attends: dict[str, float] = field(default_factory=dict)
    error: dict[str, float] = field(default_factory=dict)  # vqa: the cost's standard error per group (points)

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}"


@dataclass
class HeadJobs:
    """Every measured head of one run, with the unablated metric (``baseline``) they are compared with."""

    run: str
    kind: str
    metric: str
    unit: str
    higher_is_better: bool
    ablation: str
    examples: int
    example_name: str
    threshold: float
    distance_unit: str
    groups: list[str]
    baseline: dict[str, float]
    heads: list[HeadJob]
    extra: dict[str, Any] = field(default_factory=dict)

    def necessary(self) -> dict[str, list[str]]:
        """Per group, the heads whose ablation costs more than ``threshold`` (e.g. ``{"count": ["L1H2"]}``)."""
        return {group: [job.name for job in self.heads if job.cost.get(group, 0.0) > self.threshold]
                for group in self.groups}

    def typical_error(self) -> float | None:
        """The median standard error of a head's cost on a template (vqa; None where it is not measured)."""
        errors = sorted(value for job in self.heads for group, value in job.error.items() if group != "all")
        return errors[len(errors) // 2] if errors else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "necessary": self.necessary(), "typical_error": self.typical_error()}


def check_heads(run: Run, layer: int | None = None, head: int | None = None) -> list:
    """The run's self-attention layers, after refusing (one line) a run without heads, a task this does not measure,
    and a layer or head index outside the model."""
    layers = self_attention_layers(run.model)
    if not layers:
        raise RunError(f"{run.path.name}: its model ({run.family}) has no attention heads to ablate (a CNN?)")
    if run.task.kind not in PROBES:
        raise RunError(f"{run.path.name} is a {run.task.kind} run; tokennet heads measures "
                       f"{' and '.join(PROBES)} runs")
    if layer is not None and not 0 <= layer < len(layers):
        raise DataError(f"layer {layer} out of range: the model has layers 0..{len(layers) - 1}")
    heads = min(attention.num_heads for attention in layers)
    if head is not None and not 0 <= head < heads:
        raise DataError(f"head {head} out of range: the model has heads 0..{heads - 1}")
    return layers


def _picked(layers, layer: int | None, head: int | None) -> list[tuple[int, int]]:
    return [(index, number) for index, attention in enumerate(layers) for number in range(attention.num_heads)
            if (layer is None or index == layer) and (head is None or number == head)]


def head_jobs(run: Run, *, ablation: str = "zero", limit: int | None = None, layer: int | None = None,
              head: int | None = None) -> HeadJobs:
    """Every head of ``run`` (or only ``layer`` / ``head``) ablated in turn (``ablation``: ``"zero"`` or
    ``"mean"``), measured on the first ``limit`` held-out examples (default :data:`DEFAULT_LIMITS`)."""
    if ablation not in ABLATIONS:
        raise ConfigError(f"unknown ablation {ablation!r}; choose from {', '.join(ABLATIONS)}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    layers = check_heads(run, layer, head)
    kind = run.task.kind
    probe = PROBES[kind](run, DEFAULT_LIMITS[kind] if limit is None else limit)
    run.model.eval()
    with recorded_means(layers) as means:  # the unablated pass records each head's mean output
        baseline = probe.score()
    reference = getattr(probe, "hits", None)  # vqa: which questions the unablated model answers right
    distances, attends = probe.distances(), probe.attends()
    shares = attends.pop("shares", {})
    sign = 1.0 if probe.higher_is_better else -1.0  # a cost is always "how much worse"
    jobs = []
    for index, number in _picked(layers, layer, head):
        replacement = means[index].head(number) if ablation == "mean" else None
        with ablated_head(layers[index], number, replacement):
            scores = probe.score()
        cost = {group: round(sign * (baseline[group] - scores[group]), 4) for group in baseline}
        error = probe.standard_error(reference) if reference is not None else {}
        jobs.append(HeadJob(index, number, scores, cost, _at(distances, index, number),
                            _at(shares, index, number) or {}, error))
    return HeadJobs(str(run.path), kind, probe.metric, probe.unit, probe.higher_is_better, ablation, probe.examples,
                    probe.example_name, THRESHOLDS[kind], probe.distance_unit, list(baseline), baseline, jobs, attends)


def _at(per_layer: dict[int, list], layer: int, head: int):
    """``per_layer[layer][head]``, or None where that was not measured."""
    heads = per_layer.get(layer, [])
    return heads[head] if head < len(heads) else None
