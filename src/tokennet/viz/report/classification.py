"""The report panel of classifiers (images, 1-D signals, audio): accuracy, confusion matrix, the most confident
mistakes, and where the model looks (attention rollout from ``tokennet viz``).

One panel serves every classifier kind; what differs is how the held-out set is read (a
:class:`TestSet` getter: images as they are, audio as the spectrogram images the AST reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention_maps import _plt, _show_image
from .html import Section, esc, img, number, png_of

__all__ = ["classifier_panel", "predictions", "confusion", "TestSet", "image_test_set", "audio_test_set"]

MISTAKES = 8
OVERLAYS = 3


@torch.no_grad()
def predictions(model, x: torch.Tensor, batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predicted class, its probability)`` for every input of ``x`` ``(N, C, ...)``, in batches."""
    dev = next(model.parameters()).device
    preds, probs = [], []
    for i in range(0, len(x), batch_size):
        batch_probs = model(x[i:i + batch_size].to(dev)).logits.float().softmax(-1).cpu()  # (b, K)
        top_prob, top_class = batch_probs.max(-1)
        preds.append(top_class)
        probs.append(top_prob)
    return torch.cat(preds), torch.cat(probs)


def confusion(y: torch.Tensor, pred: torch.Tensor, k: int) -> torch.Tensor:
    """``C[i, j]`` = how many test inputs of class ``i`` were predicted as ``j``."""
    return torch.bincount(y * k + pred, minlength=k * k).view(k, k)  # (K, K)


def _confusion_png(cm: torch.Tensor, classes: tuple[str, ...]) -> bytes:
    plt = _plt()
    k = len(classes)
    size = min(7.5, 2.2 + 0.42 * k)
    fig, ax = plt.subplots(figsize=(size + 0.8, size))
    rows = cm.float() / cm.sum(1, keepdim=True).clamp_min(1)  # each true class's row sums to 1
    mappable = ax.imshow(rows.numpy(), cmap="Blues", vmin=0, vmax=1)
    if k <= 15:
        for i in range(k):
            for j in range(k):
                if cm[i, j]:
                    ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if rows[i, j] > 0.6 else "#1d2329")
    ax.set_xticks(range(k), [str(name) for name in classes], rotation=45 if max(map(len, map(str, classes))) > 2 else 0,
                  ha="right" if max(map(len, map(str, classes))) > 2 else "center", fontsize=8)
    ax.set_yticks(range(k), [str(name) for name in classes], fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix (counts; colour = share of the true class)", fontsize=10)
    fig.colorbar(mappable, ax=ax, fraction=0.046, pad=0.04)
    return png_of(fig)


def _thumb(x: torch.Tensor) -> bytes:
    """A small picture of one input: the image, or the signal as a line for 1-D data."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.6, 1.6) if x.dim() == 3 else (2.2, 1.3))
    if x.dim() == 3:  # (C, H, W)
        _show_image(ax, x)
        ax.axis("off")
    else:  # (C, L)
        for channel in x:
            ax.plot(channel.numpy(), lw=1)
        ax.set_xticks([])
        ax.set_yticks([])
    return png_of(fig, dpi=85)


@dataclass
class TestSet:
    """A classifier's held-out set as the model takes it: ``x`` ``(N, C, ...)``, labels ``y`` ``(N,)``."""

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    name: str


def image_test_set(run) -> TestSet:
    """The test split of the run's image (or 1-D signal) dataset."""
    test = run.data.held_out()
    return TestSet(test.x_test, test.y_test, test.classes, test.name)


@torch.no_grad()
def audio_test_set(run, batch_size: int = 256) -> TestSet:
    """The test clips of an audio run, as the log-mel spectrogram images ``(N, 1, mels, frames)`` the AST reads."""
    model = run.model
    test = run.data.held_out()
    dev = next(model.parameters()).device
    x = torch.cat([model.spectrogram_image(test.x_test[i:i + batch_size].to(dev))[:, None].cpu()  # (b, 1, mels, frames)
                   for i in range(0, len(test.x_test), batch_size)])
    names = run.task.label_names(run) or list(test.labels)
    return TestSet(x, test.y_test, tuple(names), test.name)


def classifier_panel(run, log, test_set: Callable[..., TestSet] = image_test_set) -> list[Section]:  # noqa: ARG001
    """Accuracy, confusion matrix, most confident mistakes and attention rollout of a classifier run."""
    from . import viz_pictures

    test = test_set(run)
    pred, prob = predictions(run.model, test.x)
    y = test.y
    k = len(test.classes)
    counts = confusion(y, pred, k)
    acc = float(counts.diag().sum()) / max(1, len(y))
    head = []
    if "test_accuracy" in run.metrics:
        head.append(f"test accuracy {number(run.metrics['test_accuracy'], 'test_accuracy')} (metrics.json)")
    if "baseline_svm_accuracy" in run.metrics:
        head.append(f"RBF-SVM baseline {number(run.metrics['baseline_svm_accuracy'], 'baseline_svm_accuracy')}")
    head.append(f'recomputed from the matrix below: <span class="mono" data-recomputed="test_accuracy">{acc!r}'
                f"</span> over {len(y)} test inputs of {esc(test.name)}")
    out = [("Test accuracy and confusion", f'<p class="sub">{" · ".join(head)}</p>'
            + img(_confusion_png(counts, test.classes), "confusion matrix", cls="wide", width=620))]

    wrong = (pred != y).nonzero().flatten()
    order = wrong[prob[wrong].argsort(descending=True)][:MISTAKES]
    if len(order):
        thumbs = "".join(img(_thumb(test.x[i]), f"test #{int(i)}",
                             f"#{int(i)}: {test.classes[int(y[i])]} → {test.classes[int(pred[i])]} "
                             f"(p = {float(prob[i]):.2f})") for i in order)
        body = (f'<p class="sub">The {len(order)} wrong answers the model was surest of (of {len(wrong)} '
                f'mistakes): true class → predicted class.</p><div class="thumbs">{thumbs}</div>')
    else:
        body = '<p class="sub">No mistakes on the test set.</p>'
    out.append(("Most confident mistakes", body))

    layer = run.model.config.num_layers - 1
    pics, similarity = [], None
    for i in range(min(OVERLAYS, len(y))):
        for name, png in viz_pictures(run, index=i, layer=layer):
            if name == "rollout.png":
                pics.append(img(png, f"attention rollout, test #{i}", f"test #{i} (tokennet viz --index {i})"))
            elif name == "position_similarity.png":
                similarity = img(png, "position similarity", "learned position embeddings: cosine similarity")
    out.append(("Where the model looks", '<p class="sub">Attention rollout of a few test inputs (Abnar &amp; Zuidema '
                "2020): the last layer's attention and the rollout through all layers, over the input.</p>"
                f'<div class="plots">{"".join(pics)}{similarity or ""}</div>'))
    return out

