"""Claim 14 (issue 46): one transformer for every modality — one trunk trained on text, pictures, speech, the sphere
and graphs at once does each task about as well as that task alone, with a fraction of the parameters, and its shared
digit head answers the same digit alike whether drawn, spoken or projected onto a sphere.

Training the runs takes many minutes (three seeds of the multimodal run and five single-task runs each), so the claim
reads ``bench/results/multimodal-sharing.json``, written by ``python bench/multimodal.py sharing``.
"""

from __future__ import annotations

from ._registry import Result, claim
from .architectures import read_bench_claim

__all__ = ["claim_one_trunk"]

FILE, SCRIPT = "multimodal-sharing.json", "multimodal.py sharing"


@claim("one-trunk-every-modality", "14")
def claim_one_trunk(seed: int = 0) -> Result:
    """"You can tokenize anything, whether it's image, text, or audio data ... the details do not matter"; "right now
    there's just one to rule them all."

    One stack of blocks trained on five modalities at once, against each task alone with the same trunk shape for the
    same number of that task's steps; the parameters of the one run against the five; the shared digit head's
    agreement on pairs of the same digit across modalities: read from the bench that trains them.
    """
    return read_bench_claim(FILE, SCRIPT)
