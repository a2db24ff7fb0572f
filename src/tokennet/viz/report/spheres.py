"""The report panel of sphere runs: the rotation table (NR/NR, R/R, NR/R) and one patch's attention."""

from __future__ import annotations

from .html import Section, esc, img, number, table

__all__ = ["sphere_panel"]


def sphere_panel(run, log) -> list[Section]:  # noqa: ARG001
    """The configured model's test accuracy unrotated and rotated, the rotation table of the three models
    (train/test: NR = not rotated, R = uniformly random rotations), then ``tokennet viz``'s picture."""
    m = run.metrics
    out: list[Section] = []
    if "test_accuracy" in m:
        rows = [[esc("unrotated test images"), number(m["test_accuracy"], "test_accuracy")]]
        if "test_accuracy_rotated" in m:
            rows.append([esc("rotated test images"), number(m["test_accuracy_rotated"], "test_accuracy_rotated")])
        trained = "rotated" if m.get("train_rotated") else "unrotated"
        out.append((f"This model (trained on {trained} images)", table(["test set", "accuracy"], rows, num_cols=(1,))))
    if "ablation" in m:
        regimes = list(next(iter(m["ablation"].values()), {}))
        rows = [[esc(name)] + [number(v, f"ablation.{name}.{k}") for k, v in row.items()]
                for name, row in m["ablation"].items()]
        steps = m.get("ablation_steps")
        each = f"each model trained {steps:,} steps on the same images" if steps else "same steps and images"
        if steps and steps != m.get("step"):
            each += f"; this model's figures above are after its {m.get('step'):,}"
        out.append((f"Rotations: test accuracy by train/test regime ({each})",
                    table(["model"] + [esc(regime) for regime in regimes], rows,
                          num_cols=tuple(range(1, len(regimes) + 1)))))
    if run.data is not None:
        from . import viz_pictures

        for name, png in viz_pictures(run, index=0):
            out.append((f"Test image 0: {name.removesuffix('.png').replace('_', ' ')}", img(png, name)))
    return out

