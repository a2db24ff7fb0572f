"""Audio: the spoken-digit AST on speech it never trained on, and the training changes that help, measured.

Every variant is the ``audio`` recipe's model (``ast-digits``) and training settings (600 steps × 64, AdamW
lr 2e-3, 100 warm-up steps, weight decay 0.05, β₂ 0.99, no time budget), trained on the generated espeak-ng
set (seed 0: 92 training voices, 20 held-out) through :class:`~tokennet.data.image_batches.ImageBatches`
over the waveforms — the same clips in the same order as the recipe's precomputed spectrograms — with one
change at a time:

- ``baseline``: the recipe as it is (SpecAugment on: two masks of ≤ 6 mel bins and two of ≤ 12 frames);
- ``no-specaug``: SpecAugment off;
- ``fresh-noise``: the same clips generated clean, with the recipe's white noise (U(5, 30) dB) drawn afresh
  at every step — the start of every variant below (a perturbation must come before the noise);
- ``speed``: + speed perturbation, factor U(0.85, 1.15) (tempo and pitch together);
- ``noise``: white, pink or babble noise (babble of words no test uses) at U(0, 30) dB instead;
- ``voices``: + 30 more espeak-ng voice variants × 8 accents (240 voices, training only; the held-out test
  voices and their clips are unchanged);
- ``eq``: + half the clips through a random smooth equalizer (tilt ±3 dB/octave, a ±6 dB bump);
- ``lowpass``: + 30 % of the clips low-passed at U(3.5, 7.5) kHz;
- ``warp``: + the model's frequency warp (VTLP), α ~ U(0.85, 1.15);
- ``cmn``: + the model's per-band mean normalization (``normalize=mel``);
- ``resynth``: + half the clips re-synthesized from their LPC envelope with a new voice source at a pitch of
  U(80, 260) Hz (pitch perturbation at the same tempo, and a source unlike espeak-ng's);
- ``resynth+voices``: both;
- ``noise+resynth+voices``: the mixed noise too (the recipe's ``wave_augment=auto``); ``…-specaug`` without
  SpecAugment, ``…+cmn`` with per-band normalization, ``…-specaug+cmn`` both;
- ``all``: speed, mixed noise, voices, equalizer, low-pass, warp and per-band normalization together.

Evaluated on (names as the recipe would write ``test_accuracy_<name>``): ``test`` (the held-out voices, as
generated), ``clean`` (the same clips without their noise), ``white|pink|babble_{20,10,0}db`` (the clean
clips with that noise at that SNR), ``other_synth`` (Flite and Festival voices, 240 clips) and per engine;
and for clips of any length, ``long_raw`` (the held-out voices' words as espeak-ng writes them, untrimmed,
spoken slowly: 60–110 words per minute, so many last over a second) and ``long_4s`` (each clean test word
at a random place in 4 s of pink noise at 20 dB), read through :func:`~tokennet.tokens.clips.prepare_clip`
(trim, windows every 0.25 s) and combined both ways (``confident`` and ``mean``).

    python bench/audio_robust.py                          # every variant, 600 steps, seed 0
    python bench/audio_robust.py --variants baseline all --steps 600 --seed 0

Writes ``bench/results/audio_robust.json`` (rows of variants not run this time stay in it when the steps and seed
match). Accuracies at fixed steps do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.audio_augment import WaveAugment, WaveFeatures  # noqa: E402
from tokennet.data.image_batches import ImageBatches  # noqa: E402
from tokennet.data.noise import pink_noise  # noqa: E402
from tokennet.data.speech_eval import evaluation_sets, training_word_bank  # noqa: E402
from tokennet.data.spoken_digits import (  # noqa: E402
    DIGITS,
    EXTRA_VOICES,
    espeak_synth,
    load_spoken_digits,
    synthesize_spoken_digits,
)
from tokennet.models.registry import create_model  # noqa: E402
from tokennet.tokens.audio import resample  # noqa: E402
from tokennet.tokens.clips import COMBINES, combine_windows, prepare_clip  # noqa: E402
from tokennet.train.trainer import TrainConfig, Trainer  # noqa: E402

# The recipe's clips carry white noise at U(5, 30) dB from generation; a perturbation such as a speed change must
# come before the noise (or it reshapes the noise and leaves a silent tail), so the variants start from the same
# clips generated clean and add that noise at every step instead (``fresh-noise``), then change one thing.
WHITE = WaveAugment(noises=("white",), noise_prob=1.0, noise_snr=(5.0, 30.0))
MIXED = replace(WHITE, noises=("white", "pink", "babble"), noise_snr=(0.0, 30.0))
SPEED = (0.85, 1.15)
# name → (training clips "noisy" (the recipe's) or "clean", extra voices, wave augmentation, model overrides)
VARIANTS_TABLE = {
    "baseline": ("noisy", False, None, {}),
    "no-specaug": ("noisy", False, None, {"freq_mask": 0, "time_mask": 0}),
    "fresh-noise": ("clean", False, WHITE, {}),
    "speed": ("clean", False, replace(WHITE, speed=SPEED), {}),
    "noise": ("clean", False, MIXED, {}),
    "voices": ("clean", True, WHITE, {}),
    "eq": ("clean", False, replace(WHITE, eq_db=6.0), {}),
    "lowpass": ("clean", False, replace(WHITE, lowpass=(3500.0, 7500.0)), {}),
    "warp": ("clean", False, WHITE, {"freq_warp": 0.15}),
    "cmn": ("clean", False, WHITE, {"normalize": "mel"}),
    "resynth": ("clean", False, replace(WHITE, resynth=(80.0, 260.0)), {}),
    "resynth+voices": ("clean", True, replace(WHITE, resynth=(80.0, 260.0)), {}),
    "noise+resynth+voices": ("clean", True, replace(MIXED, resynth=(80.0, 260.0)), {}),
    "noise+resynth+voices-specaug": ("clean", True, replace(MIXED, resynth=(80.0, 260.0)),
                                     {"freq_mask": 0, "time_mask": 0}),
    "noise+resynth+voices+cmn": ("clean", True, replace(MIXED, resynth=(80.0, 260.0)), {"normalize": "mel"}),
    "noise+resynth+voices-specaug+cmn": ("clean", True, replace(MIXED, resynth=(80.0, 260.0)),
                                         {"freq_mask": 0, "time_mask": 0, "normalize": "mel"}),
    "all": ("clean", True, replace(MIXED, speed=SPEED, eq_db=6.0, lowpass=(3500.0, 7500.0)),
            {"freq_warp": 0.15, "normalize": "mel"}),
}
TRAIN = dict(max_iters=600, batch_size=64, lr=2e-3, warmup_iters=100, weight_decay=0.05, beta2=0.99)


def long_sets(seed: int, clean_x: torch.Tensor, y: torch.Tensor, voices: list[str]):
    """``long_raw`` (untrimmed slow espeak-ng words of the held-out voices) and ``long_4s`` (clean words in 4 s of
    pink noise at 20 dB), as lists of waveforms at 16 kHz."""
    from tokennet.data.noise import mix_at_snr

    rng = np.random.default_rng([seed, 4242])
    raw = []
    for d, v in zip(y.tolist(), voices, strict=True):
        x, rate = espeak_synth(DIGITS[d], v, int(rng.integers(60, 111)), int(rng.integers(20, 81)))
        w = resample(x.astype(np.float32) / 32768.0, rate, 16000)
        raw.append(w + rng.standard_normal(len(w)).astype(np.float32) * 1e-4)  # a faint floor, not digital zero
    four = []
    for clip in clean_x.numpy():
        nz = np.flatnonzero(np.abs(clip) > 0)
        word = clip[nz[0]:nz[-1] + 1]
        out = np.zeros(4 * 16000, np.float32)
        off = int(rng.integers(0, len(out) - len(word) + 1))
        out[off:off + len(word)] = word
        four.append(mix_at_snr(out, pink_noise(len(out), rng), 20.0, 16000))
    return {"long_raw": raw, "long_4s": four}


@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    pred = torch.cat([model(x[i:i + 200]).logits.argmax(-1) for i in range(0, len(x), 200)])
    return float((pred == y).float().mean())


@torch.no_grad()
def windowed_accuracy(model, clips: list[np.ndarray], y: torch.Tensor) -> dict[str, float]:
    model.eval()
    right = dict.fromkeys(COMBINES, 0)
    lengths = []
    for clip, label in zip(clips, y.tolist(), strict=True):
        c = prepare_clip(clip, 16000, model.config.clip_samples)
        lengths.append(c.seconds)
        lp = torch.log_softmax(model(torch.from_numpy(c.windows)).logits.float(), -1)  # (W, K)
        for how in COMBINES:
            right[how] += int(combine_windows(lp, how).argmax()) == label
    out = {how: right[how] / len(clips) for how in COMBINES}
    out["mean_seconds"] = float(np.mean(lengths))
    out["share_over_1s"] = float(np.mean(np.array(lengths) > 1.0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS_TABLE), choices=list(VARIANTS_TABLE))
    p.add_argument("--steps", type=int, default=TRAIN["max_iters"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "audio_robust.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    base = load_spoken_digits(synthesize_spoken_digits(seed=args.seed))  # the recipe's set: its noisy test split
    evals = evaluation_sets(seed=args.seed)
    clean_x, clean_y, clean_v = evals["clean"]
    longs = long_sets(args.seed, clean_x, clean_y, clean_v)
    other_v = np.array(evals["other_synth"][2])
    words = training_word_bank(args.seed)
    results = {}
    for name in args.variants:
        kind, more_voices, augment, over = VARIANTS_TABLE[name]
        snr = None if kind == "clean" else (5.0, 30.0)
        ds = load_spoken_digits(synthesize_spoken_digits(seed=args.seed, snr_db=snr,
                                                         extra_voices=EXTRA_VOICES if more_voices else ()))
        torch.manual_seed(args.seed)
        model = create_model("ast-digits", num_classes=10, **over)
        feats = WaveFeatures(augment, lambda w, m=model: m.spectrogram_image(w)[:, None], words=words)
        src = ImageBatches(ds.x_train, ds.y_train, TRAIN["batch_size"], seed=args.seed, augment=feats, num_classes=10)
        cfg = TrainConfig(**{**TRAIN, "max_iters": args.steps}, eval_interval=0, checkpoint_interval=0, log_interval=0,
                          progress=False, report=False, seed=args.seed)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            Trainer(model, cfg, src, out_dir=scratch).fit()
        row = {"train_clips": len(ds.y_train), "wall_s_shared_machine": round(time.perf_counter() - t0, 1),
               "test": accuracy(model, base.x_test, base.y_test)}
        for key, (x, y, _) in evals.items():
            row[key] = accuracy(model, x, y)
        ox, oy, _ = evals["other_synth"]
        with torch.no_grad():
            pred = torch.cat([model(ox[i:i + 200]).logits.argmax(-1) for i in range(0, len(ox), 200)]).numpy()
        for engine in ("flite", "festival"):
            sel = np.char.startswith(other_v.astype(str), engine)
            row[f"other_synth_{engine}"] = float((pred[sel] == oy.numpy()[sel]).mean())
        row["other_synth_by_voice"] = {v: float((pred[other_v == v] == oy.numpy()[other_v == v]).mean())
                                       for v in sorted(set(other_v.tolist()))}
        for key, clips in longs.items():
            row[key] = windowed_accuracy(model, clips, clean_y)
        results[name] = row
        flat = {k: (f"{100 * v:.1f}" if isinstance(v, float) and k != "wall_s_shared_machine" else v)
                for k, v in row.items() if not isinstance(v, dict)}
        print(name, flat, {k: {h: round(100 * row[k][h], 1) for h in COMBINES} for k in longs},
              f"by voice {row['other_synth_by_voice']}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # rows of other variants measured at the same steps and seed stay in the table
        old = json.loads(out.read_text())
        if (old.get("steps"), old.get("seed")) == (args.steps, args.seed):
            results = {**{k: v for k, v in old.get("results", {}).items() if k not in results}, **results}
    write(out, {"steps": args.steps, "seed": args.seed, "results": results, "torch": torch.__version__},
          settings=vars(args), torch=torch.__version__)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
