"""The guard against stale evaluation: what training writes is what a fresh process recomputes.

For every recipe (each architecture/form), a short run with the recipe's real trainer settings —
fused AdamW, evaluations *during* training, the recipe's own ``evaluate``/``finish`` — must leave:

- ``metrics.json`` equal to what ``tokennet eval RUN`` recomputes in a fresh process from the saved
  files (a fresh model), metric by metric;
- the model object left in memory after training giving the same logits as the reloaded one;

and the same for a run resumed from its checkpoint. Stale derived weights (a cache that an in-place
optimizer update does not invalidate) made both fail: evaluations after the first one used old Q/K/V.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import tokennet.recipes.base as recipe_base
from tokennet.models.registry import load_pretrained
from tokennet.recipes import train

SMALL_LM = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 8, "eval_iters": 2,
            "sample_tokens": 8}
SMALL_S2S = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 40, "val_size": 16,
             "beam_size": 2}
SMALL_CAP = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 24, "val_size": 8}
CASES = {
    "gpt": {**SMALL_LM, "vocab_size": 300},
    "gpt-char": SMALL_LM,
    "vit": {"dim": 32, "num_layers": 2, "batch_size": 32},
    "seq2seq": SMALL_S2S,
    "seq2seq/bahdanau": {**SMALL_S2S, "arch": "bahdanau"},
    "caption": SMALL_CAP,
    "caption/decoder-only": {**SMALL_CAP, "form": "decoder-only"},
    "graph": {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 64, "val_size": 16,
              "ablation": False},
}
CASES["sphere"] = {"num_centres": 48, "num_samples": 256, "patch_size": 8, "rings": 2, "sh_degree": 3, "dim": 32,
                   "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 40, "val_size": 16,
                   "ablation": False}
CASES["audio"] = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "n_mels": 16, "clip_samples": 8000}
# Evaluations at steps 3 and 6 and at the end: the final metrics come after earlier no-grad passes.
STEPS = {"max_iters": 8, "eval_interval": 3, "warmup_iters": 2, "progress": False}


def _train_capturing_model(monkeypatch, recipe, **kw):
    """Train; return ``(run_dir, metrics, the model object that training left in memory)``."""
    held = {}
    real_save = recipe_base.save_pretrained

    def save(model, directory, **skw):
        held["model"] = model
        return real_save(model, directory, **skw)

    monkeypatch.setattr(recipe_base, "save_pretrained", save)
    run_dir, metrics = train(recipe, device="cpu", **kw)
    monkeypatch.setattr(recipe_base, "save_pretrained", real_save)
    return run_dir, metrics, held["model"]


def _eval_in_fresh_process(run_dir) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    out = subprocess.run([sys.executable, "-m", "tokennet", "-q", "eval", str(run_dir), "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _numbers(d: dict, prefix: str = "") -> dict[str, float]:
    """Flatten the numeric metrics (nested dicts such as ``exact_match_by_format`` included)."""
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            flat[f"{prefix}{k}"] = float(v)
    return flat


def _check_run(run_dir, model):
    saved = _numbers(json.loads((run_dir / "metrics.json").read_text()))
    fresh = _numbers(_eval_in_fresh_process(run_dir))
    common = sorted(set(saved) & set(fresh) - {"test_size", "train_size"})
    assert common, f"metrics.json and tokennet eval share no metric: {sorted(saved)} vs {sorted(fresh)}"
    for k in common:
        assert math.isclose(saved[k], fresh[k], rel_tol=1e-5, abs_tol=1e-6), \
            f"{k}: metrics.json {saved[k]} but a fresh process recomputes {fresh[k]}"
    # The model left in memory after training is the model that was saved.
    reloaded = load_pretrained(run_dir).eval()
    model.eval()
    x = reloaded.example_input(2)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, reloaded(x).logits, rtol=0, atol=0)
    return common


@pytest.fixture(scope="module")
def wav_dir(tmp_path_factory):
    """A tiny LABEL/*.wav directory for the audio recipe (no espeak-ng needed)."""
    from support import write_wav_dataset

    return write_wav_dataset(tmp_path_factory.mktemp("wavs"), per_label=6)


@pytest.mark.parametrize("case", list(CASES))
def test_metrics_json_equals_a_fresh_eval_also_after_resume(case, tmp_path, corpus, monkeypatch, request):
    recipe = case.split("/")[0]
    data = str(corpus) if recipe.startswith("gpt") else None
    if recipe == "audio":
        data = str(request.getfixturevalue("wav_dir"))
    sets = {**CASES[case], **STEPS}
    run_dir, _, model = _train_capturing_model(monkeypatch, recipe, data=data, out=tmp_path / "run", sets=sets)
    compared = _check_run(run_dir, model)
    history = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert sum(1 for r in history if "step" in r and any(k.startswith(("val_", "test_")) for k in r)) >= 3, \
        "the run must evaluate during training, not only at the end"
    # Resume the finished run for a few more steps: the same guarantee holds.
    resumed, metrics, model = _train_capturing_model(monkeypatch, recipe, out=run_dir, resume=True,
                                                     sets={"max_iters": 11})
    assert metrics["step"] == 11
    assert _check_run(resumed, model) == compared
