"""The report panel of graph runs: the structural ablation (or the molecule baselines) and where a node looks."""

from __future__ import annotations

from .html import Section, esc, img, number, table

__all__ = ["graph_panel"]


def graph_panel(run, log) -> list[Section]:  # noqa: ARG001
    """The ablation table of a generated-task run (what each way of giving attention the structure buys),
    or a molecule run's test error next to its baselines; then ``tokennet viz``'s node attention and
    Laplacian positions of a test graph (generated task)."""
    m = run.metrics
    out: list[Section] = []
    if "ablation" in m:
        best = max(m["ablation"].values())
        this = m.get("variant")
        rows = [[esc(name) + (" (this run's model)" if name == this else ""), number(acc, f"ablation.{name}")]
                for name, acc in m["ablation"].items()]
        classes = ["hit" if acc == best else "" for acc in m["ablation"].values()]
        out.append(("Structure ablation (test accuracy, same steps and batches; the best row highlighted)",
                    table(["variant", "test accuracy"], rows, classes, num_cols=(1,))))
    if "test_mae" in m:
        rows = [[esc("this model"), number(m["test_mae"], "test_mae")]]
        rows += [[esc(k.removeprefix("baseline_").removesuffix("_mae").replace("_", " ")), number(v, k)]
                 for k, v in m.items() if k.startswith("baseline_")]
        out.append((f"Test mean absolute error ({esc(m.get('target', ''))})",
                    table(["predictor", "test MAE"], rows, num_cols=(1,))))
    elif run.data is not None and run.data.kind == "marked-distance":  # pictures of a held-out graph
        from . import viz_pictures

        for name, png in viz_pictures(run, index=0):
            out.append((f"Held-out graph 0: {name.removesuffix('.png').replace('_', ' ')}", img(png, name)))
    return out

