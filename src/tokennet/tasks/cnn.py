"""A CNN classifier is an image classifier: the same verbs and inputs as a ViT run, its own pictures.

``run.classify(images)`` and ``tokennet generate RUN --image FILE`` work exactly as for a ViT
(:class:`~tokennet.tasks.classification.ImageClassification`); what differs is where the model looks. A CNN
has no attention to draw; its class activation map (Zhou et al. 2016) is the honest picture of a GAP +
linear head: each unit's vote ``w_c · h_u`` for the predicted class, whose mean is the logit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError
from .base import register_task
from .classification import ImageClassification

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["CNNClassification"]

OVERLAYS = 3


@register_task
class CNNClassification(ImageClassification):
    """A CNN: ``run.classify(images or paths)`` → ``(class index, probability)`` per image."""

    name = "image classification"
    kind = "cnn-classifier"
    families = ("cnn",)
    viz_uses = ("index", "image")
    explorer = None  # no attention to draw: `tokennet explore` refuses in one line

    def draw(self, run: Run, out_dir: Path, *, index: int | None = None, image=None, **_) -> list[Path]:
        """``class_activation_map.png``: a test image (or ``--image``), the predicted class's activation map, and
        one unit's receptive field."""
        from ..viz.cnn import draw_class_activation

        if image is not None:
            x = self.inputs_of(run, [image])[0]
            what = Path(image).name
        else:
            data = run.data.held_out()
            i = 0 if index is None else index
            if not 0 <= i < len(data.y_test):
                raise DataError(f"index {i} out of range: 0..{len(data.y_test) - 1}")
            x, what = data.x_test[i], f"{data.name} test #{i}: label {data.classes[int(data.y_test[i])]}"
        classes = run.data.held_out().classes if run.data is not None else None
        return [draw_class_activation(run.model, x, Path(out_dir) / "class_activation_map.png", title=what,
                                      classes=classes)]

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        """The classifier's accuracy, confusion matrix and confident mistakes, then class activation maps."""
        from ..viz.report import viz_pictures
        from ..viz.report.classification import classifier_panel
        from ..viz.report.html import img

        # The shared panel's last section draws attention rollouts, which a CNN has not: replaced by its CAMs.
        sections = [section for section in classifier_panel(run, log) if section[0] != "Where the model looks"]
        pics = [img(png, f"test #{i}", f"test #{i} (tokennet viz --index {i})")
                for i in range(OVERLAYS) for _, png in viz_pictures(run, index=i)]
        sections.append(("Where the model looks", '<p class="sub">Class activation maps: each unit of the last '
                         "feature map votes for the predicted class; the logit is the mean of the votes.</p>"
                         f'<div class="plots">{"".join(pics)}</div>'))
        return sections
