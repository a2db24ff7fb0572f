"""The explorer of sphere runs: patches are regions of the sphere, drawn as their centres on a longitude–latitude
map (equirectangular: longitude across, latitude down from the north pole), where the unrotated image lies near
the top; a flat picture is projected onto the sphere as the run's data projects it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ...errors import RunError
from ...tokens.sphere import to_angles
from .views import Exploration, Explorer, check_index, read_upload, top_k

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["SphereExplorer"]


class SphereExplorer(Explorer):
    """A sphere transformer: one token per patch of the sphere; the output is the class probabilities."""

    accepts = ("image",)

    def __init__(self, run: Run):
        super().__init__(run)
        if run.data is None:
            raise RunError(f"{run.path} has no data spec (run.json): the page needs its held-out images")
        _, _, (self.x_test, self.y_test) = run.data.split()
        self.classes = list(run.data.images().classes or [])
        theta, phi = to_angles(run.model.centres.cpu().double())  # polar angle from the north pole, longitude
        self.positions = [[round((longitude + math.pi) / (2 * math.pi), 4), round(colatitude / math.pi, 4)]
                          for colatitude, longitude in zip(theta.tolist(), phi.tolist(), strict=True)]

    def examples(self, limit: int) -> list[str]:
        return [f"test #{i}: {self.classes[int(y)] if self.classes else int(y)}"
                for i, y in enumerate(self.y_test[:limit].tolist())]

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.y_test))
        signal = self.run.data.project(self.x_test[index:index + 1], self.run.model.samples.cpu())  # (1, C, M)
        label = int(self.y_test[index])
        return self.explore(signal, f"test #{index}: label {self.classes[label] if self.classes else label}")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        signal = read_upload(fields, "image", lambda path: self.run.task.inputs_of(self.run, [path]))
        return self.explore(signal, "your picture, projected onto the sphere")

    def explore(self, signal: torch.Tensor, title: str) -> Exploration:
        inputs = signal.to(self.run.device)
        n = len(self.positions)
        tokens = [{"label": f"patch {k}", "view": "sphere", "cell": k} for k in range(n)]
        view = {"kind": "graph", "positions": self.positions, "edges": [], "marked": [],
                "caption": f"{n} patch centres on the sphere: longitude across, latitude down (north pole at the "
                           "top, where the unrotated image lies)"}

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                probs = self.run.model(inputs).logits.float().softmax(-1)[0].cpu()
            top = top_k(probs, self.classes or None)
            return {"text": f"{top[0][0]} ({top[0][1]:.2f})", "top": top}

        return Exploration(inputs, tokens, {"sphere": view}, title, predict)
