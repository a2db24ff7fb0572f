"""Recipe ``audio``: an Audio Spectrogram Transformer on spoken digits, against an MFCC + SVM baseline.

Data (``--data``): ``spoken-digits`` (the default) synthesizes the ten digit words with ``espeak-ng``
over 112 voices (8 English accents × 14 voice variants), holding out whole voices for the test set
(:mod:`tokennet.data.spoken_digits`; cached after the first run); ``--data DIR`` reads ``DIR/LABEL/*.wav``
(or ``DIR/train/…`` and ``DIR/test/…``) instead; a file of any length has its leading and trailing silence
trimmed and, if the word is still longer than ``clip_samples``, keeps its most energetic window
(:func:`~tokennet.tokens.clips.fit_window`). ``tokennet generate --audio`` and ``viz --audio`` read any
length as overlapping windows (:mod:`tokennet.tokens.clips`).

Speech it never trained on (``robustness=true``, the default, on the generated digits): ``metrics.json``
adds ``test_accuracy_<name>`` for the sets of :func:`~tokennet.data.speech_eval.evaluation_sets` —
``other_synth`` (Flite and Festival voices, when those Debian packages are installed; never used in
training), ``clean`` (the held-out voices' clips without their noise) and ``white|pink|babble_{20,10,0}db``
(those clips with the noise at that SNR of the active speech). ``tokennet eval`` recomputes them.

Training for them (``wave_augment``; ``auto``, the default, is ``noise+resynth+voices`` on the generated
digits and ``none`` on a directory): the clips synthesized clean, white/pink/babble noise at U(0, 30) dB
drawn afresh at every step, half the clips re-synthesized with a new voice source (LPC, U(80, 260) Hz), and
240 more espeak-ng voices for training; 1,500 steps (``max_iters``) capped at 270 s for the whole run (``time_budget``:
preparation and final evaluation included; a first run's one-time synthesis is added to it). Why
these (``python bench/audio_robust.py``, one change per row) and how the default run did: ``docs/experiments/audio.md``.

Model: the ``ast-digits`` preset (:mod:`tokennet.models.ast`): a 40-mel log spectrogram of 1-s clips
(25 ms windows every 10 ms: 40 × 101), tokenized by a conv stem (ViT_C, as the ``vit`` recipe's
Fashion-MNIST profile: three stride-2 3×3 convolutions, so each of the 5 × 13 = 65 tokens stands for an
8×8 cell and sees its neighbours), learned positions, 2 blocks × 64, mean pooling, SpecAugment
(``freq_mask=6`` mel bins, ``time_mask=12`` frames, two of each). The paper's tokenizer — overlapping
patches and a linear embedding — is ``--set patch_embed=conv patch_stride=4 pad=true`` (8×8 patches at
stride 4: 9 × 25 = 225 tokens; the ``ast-digits-patches`` preset); why the stem is the default:
``docs/experiments/audio.md``.

Baseline, on the same split in the same run: each clip's 13 MFCCs (the DCT-II of the same 40-mel log
spectrogram) summarized by their mean and standard deviation over time (26 numbers), standardized, then
an RBF SVM (``sklearn.svm.SVC(C=10)``). ``metrics.json`` holds ``baseline_accuracy`` next to
``test_accuracy``, and both per held-out voice (``accuracy_by_voice``, ``baseline_accuracy_by_voice``).
Goal: test accuracy ≥ 98% on held-out voices and above the baseline within 5 minutes on 2 cores; for the other
synthesizers ≥ 90%, and ≥ 95% at 10 dB of noise. Measured: ``docs/experiments/audio.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..data.image_batches import ImageBatches
from ..data.spoken_digits import (
    DEFAULT_DATA,
    DIGITS,
    EXTRA_VOICES,
    AudioSet,
    SpokenWords,
    clips_to_synthesize,
    seconds_per_clip,
)
from ..errors import DataError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..lifecycle.budget import Preparation
from ..models.registry import create_model
from ..tokens.audio import LogMelSpectrogram

__all__ = ["mfcc_stats", "mfcc_baseline"]

log = logging.getLogger(__name__)

_OPTIONS = {"baseline": True, "eval_batch_size": 200, "num_mfcc": 13, "robustness": True, "wave_augment": "auto"}
# wave_augment → the perturbation drawn afresh for every training clip at every step (tokennet.data.audio_augment);
# "none": the clips as generated or read (their spectrograms computed once); "auto": "noise+resynth+voices" on
# the generated digits, "none" on a directory.
WAVE_AUGMENTS = ("auto", "none", "noise", "noise+resynth", "noise+resynth+voices")
# 1,500 steps: how they were chosen is in docs/experiments/audio.md; time_budget caps the training time on slower
# machines (the cosine schedule then follows the clock).
_TRAIN_DEFAULTS = {"max_iters": 1500, "time_budget": 270.0, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100,
                   "weight_decay": 0.05, "beta2": 0.99, "eval_interval": 200, "log_interval": 50}


def mfcc_stats(x: torch.Tensor, spec: LogMelSpectrogram, num_mfcc: int = 13, batch: int = 500) -> np.ndarray:
    """MFCC statistics ``(N, 2·num_mfcc)``: mean and std over time of the DCT-II (orthonormal) of the log-mel
    spectrogram's first ``num_mfcc`` coefficients (Davis & Mermelstein 1980)."""
    from scipy.fft import dct

    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            mels = spec(x[i:i + batch].float()).numpy()  # (b, mels, T)
            coeffs = dct(mels, type=2, axis=1, norm="ortho")[:, :num_mfcc]  # (b, num_mfcc, T)
            out.append(np.concatenate([coeffs.mean(2), coeffs.std(2)], axis=1))  # (b, 2·num_mfcc)
    return np.concatenate(out)


def mfcc_baseline(ds: AudioSet, spec: LogMelSpectrogram, num_mfcc: int = 13
                  ) -> tuple[float, np.ndarray, str, Callable[[torch.Tensor], np.ndarray]]:
    """Fit the baseline on the training split; ``(test accuracy, test predictions, description, predict)``,
    ``predict(waveforms) → class ids`` for other test sets."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    clf = make_pipeline(StandardScaler(), SVC(kernel="rbf", C=10.0, gamma="scale"))
    clf.fit(mfcc_stats(ds.x_train, spec, num_mfcc), ds.y_train.numpy())
    pred = clf.predict(mfcc_stats(ds.x_test, spec, num_mfcc))
    desc = (f"{num_mfcc} MFCCs (DCT-II of the model's {spec.n_mels}-mel log spectrogram), mean and std over time, "
            "StandardScaler + sklearn.svm.SVC(kernel='rbf', C=10, gamma='scale')")
    return float((pred == ds.y_test.numpy()).mean()), pred, desc, lambda x: clf.predict(mfcc_stats(x, spec, num_mfcc))


def spectrograms(model, x: torch.Tensor, batch_size: int = 200) -> torch.Tensor:
    """Waveforms ``(N, samples)`` → the model's standardized spectrograms ``(N, 1, mels, frames)`` on the CPU.

    The AST's front end has no parameters, so training and evaluation compute it once per clip."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        return torch.cat([model.spectrogram_image(x[i:i + batch_size].to(dev)).cpu()
                          for i in range(0, len(x), batch_size)])[:, None]  # (N, 1, mels, frames)


def _evaluate(model, ds: AudioSet, batch_size: int, feats: torch.Tensor | None = None
              ) -> tuple[dict[str, Any], np.ndarray]:
    """Test accuracy and loss, and the predictions (for the per-voice breakdown)."""
    dev = next(model.parameters()).device
    feats = spectrograms(model, ds.x_test, batch_size) if feats is None else feats
    was = model.training
    model.eval()
    preds, loss = [], 0.0
    with torch.no_grad():
        for i in range(0, len(ds.x_test), batch_size):
            x_batch, y_batch = feats[i:i + batch_size].to(dev), ds.y_test[i:i + batch_size].to(dev)
            logits = model(x_batch).logits.float()
            preds.append(logits.argmax(-1).cpu())
            loss += float(torch.nn.functional.cross_entropy(logits, y_batch, reduction="sum"))
    model.train(was)
    pred = torch.cat(preds).numpy()
    n = max(1, len(pred))
    return {"test_accuracy": float((pred == ds.y_test.numpy()).sum() / n), "test_loss": loss / n}, pred


def _by_voice(ds: AudioSet, pred: np.ndarray) -> dict[str, float]:
    if not ds.test_voices:
        return {}
    voices = np.array(ds.test_voices)
    ok = pred == ds.y_test.numpy()
    return {v: round(float(ok[voices == v].mean()), 4) for v in sorted(set(ds.test_voices))}


def robustness(model, spec: SpokenWords, batch_size: int = 200, baseline=None) -> dict[str, float]:
    """``test_accuracy_<name>`` on every set of :func:`~tokennet.data.speech_eval.evaluation_sets` for the
    generated digits of ``spec`` (``other_synth`` only where Flite or Festival speaks on this machine), and with
    ``baseline`` (``predict(waveforms) → class ids``) ``baseline_accuracy_<name>`` beside each."""
    from ..data.other_speech import available_other_voices
    from ..data.speech_eval import evaluation_sets

    other = bool(available_other_voices())
    if not other:
        log.warning("robustness: neither flite nor festival speaks on this machine; test_accuracy_other_synth is "
                    "not measured (apt-get install flite festival)")
    sets = evaluation_sets(seed=spec.seed, per_voice=spec.per_voice, test_voices=spec.test_voices, other=other)
    out = {}
    for name, (x, y, voices) in sets.items():
        dataset = AudioSet(name, list(DIGITS), spec.sample_rate, x[:0], y[:0], x, y, list(voices))
        out[f"test_accuracy_{name}"] = _evaluate(model, dataset, batch_size)[0]["test_accuracy"]
        if baseline is not None:
            out[f"baseline_accuracy_{name}"] = float((baseline(x) == y.numpy()).mean())
    return out


def _metrics(model, ds: AudioSet, options: dict[str, Any], data: SpokenWords | None = None) -> dict[str, Any]:
    """Everything measured on the test split: the model, per voice, the baseline, and (generated digits,
    ``robustness``) the speech it never trained on — what ``tokennet eval`` recomputes."""
    m, pred = _evaluate(model, ds, options["eval_batch_size"])
    out: dict[str, Any] = {**m, "dataset": ds.name, "train_size": len(ds.y_train), "test_size": len(ds.y_test)}
    if ds.test_voices:
        out["accuracy_by_voice"] = _by_voice(ds, pred)
    predict = None
    if options["baseline"]:
        spec = model.spectrogram.cpu()
        acc, bpred, desc, predict = mfcc_baseline(ds, spec, options["num_mfcc"])
        out.update({"baseline_accuracy": acc, "baseline": desc})
        if ds.test_voices:
            out["baseline_accuracy_by_voice"] = _by_voice(ds, bpred)
    if (options.get("robustness") and data is not None and data.source == DEFAULT_DATA
            and (data.sample_rate, data.clip_samples) == (16000, 16000)):
        out.update(robustness(model, data, options["eval_batch_size"], baseline=predict))
    if options["baseline"]:
        model.spectrogram.to(next(model.parameters()).device)
    return out


def _wave_augment(spec: SpokenWords, options: dict[str, Any]) -> str:
    """The ``wave_augment`` setting with ``auto`` resolved for this data."""
    how = options["wave_augment"]
    if how not in WAVE_AUGMENTS:
        raise DataError(f"wave_augment must be one of {list(WAVE_AUGMENTS)}, got {how!r}")
    if how == "auto":
        return "noise+resynth+voices" if spec.source == DEFAULT_DATA else "none"
    return how


def _train_source(model, spec: SpokenWords, ds: AudioSet, train, options: dict[str, Any]) -> ImageBatches:
    """The training batches: spectrograms computed once (``wave_augment=none``), or waveforms perturbed afresh
    at every step and then turned into spectrograms. ``noise``: white, pink or babble noise (babble of words
    no evaluation set uses, spoken by espeak-ng) at an SNR drawn from U(0, 30) dB, on the generated clips
    synthesized *clean* (the same clips, without their white noise), or white and pink noise on a directory's
    clips as they are; ``noise+resynth``: and half the clips re-synthesized from their LPC envelope with a new
    voice source at U(80, 260) Hz; ``noise+resynth+voices``: and the generated set spoken by 240 more espeak-ng
    voices (:data:`~tokennet.data.spoken_digits.EXTRA_VOICES`; training only). ``bench/audio_robust.py``
    measures each. ``auto``: ``noise+resynth+voices`` on the generated digits, ``none`` on a directory."""
    how = _wave_augment(spec, options)
    generated = spec.source == DEFAULT_DATA
    if how == "none":
        feats = spectrograms(model, ds.x_train, options["eval_batch_size"])  # (N, 1, mels, frames), once
        return ImageBatches(feats, ds.y_train, train.batch_size, seed=train.seed, num_classes=ds.num_classes)
    import copy

    from ..data.audio_augment import WaveAugment, WaveFeatures
    from ..data.speech_eval import training_word_bank
    from ..data.spoken_digits import EXTRA_VOICES, load_spoken_digits, synthesize_spoken_digits

    x, y = ds.x_train, ds.y_train
    if generated:
        more = EXTRA_VOICES if how.endswith("+voices") else ()
        clean = load_spoken_digits(synthesize_spoken_digits(seed=spec.seed, per_voice=spec.per_voice,
                                                            test_voices=spec.test_voices, snr_db=None,
                                                            extra_voices=more))
        x, y = clean.x_train, clean.y_train
    aug = WaveAugment(noises=("white", "pink", "babble") if generated else ("white", "pink"), noise_prob=1.0,
                      noise_snr=(0.0, 30.0), resynth=(80.0, 260.0) if "resynth" in how else None)
    probe = copy.deepcopy(model).cpu().eval()  # the batches are drawn on the CPU: its spectrogram, there
    waves = WaveFeatures(aug, lambda wave: probe.spectrogram_image(wave)[:, None],
                         words=training_word_bank(spec.seed) if generated else None, sample_rate=ds.sample_rate)
    return ImageBatches(x, y, train.batch_size, seed=train.seed, augment=waves, num_classes=ds.num_classes)


def build(ctx: BuildContext) -> Job:
    dataset = ctx.data.load()
    train, device, options = ctx.train, ctx.device, ctx.options
    torch.manual_seed(train.seed)
    ctx.from_data("num_classes", dataset.num_classes)
    model = create_model("ast", **{k: v for k, v in ctx.model.items() if k != "image_size"})
    src = _train_source(model, ctx.data, dataset, train, options)
    config = model.config
    more = f" (training on {len(src.y)} with wave_augment's extra voices)" if len(src.y) != len(dataset.y_train) else ""
    log.info("%s: %d train%s / %d test clips, %d classes; AST %.3fM parameters, spectrogram %d×%d, %d tokens, "
             "%d steps per epoch", dataset.name, len(dataset.y_train), more, len(dataset.y_test), dataset.num_classes,
             model.num_parameters() / 1e6, config.n_mels, config.num_frames,
             config.grid[0] * config.grid[1] + config.num_prefix, src.steps_per_epoch)

    test_feats = spectrograms(model, dataset.x_test, options["eval_batch_size"])

    def evaluate(m) -> dict[str, float]:
        return _evaluate(m, dataset, options["eval_batch_size"], test_feats)[0]

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        # train_size counts the split's clips; the training set may hold more (wave_augment's extra voices)
        return {"epochs": round((src.max_index + 1) / src.steps_per_epoch, 2), "train_clips": len(src.y),
                "wave_augment": _wave_augment(ctx.data, options)}

    return Job(model=model.to(device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               finish=finish, data=ctx.data.replace(labels=list(dataset.labels)))


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: the run's test metrics recomputed from the saved model (and the baseline refitted)."""
    spec = run.data if data is None else run.data.replace(source=data)
    held = spec.held_out()
    if held.num_classes != run.model.config.num_classes:
        raise DataError(f"{run.path} was trained on {run.model.config.num_classes} classes, but the data has "
                        f"{held.num_classes}; evaluate it on data like its own")
    opts = {k: run.settings.get(k, v) for k, v in _OPTIONS.items()}
    return _metrics(run.model, held, opts, spec)


def preparation(spec: SpokenWords, settings: dict[str, Any]) -> Preparation | None:
    """The espeak-ng clips this run must synthesize before training (none once cached): the generated set, its
    clean copy with the extra training voices (``wave_augment``), the clean held-out clips of the robustness sets;
    timed on a few clips synthesized now. (The babble words and the other synthesizers' clips, a few hundred, are
    not counted.)"""
    if spec.source != DEFAULT_DATA:
        return None
    common = {"seed": spec.seed, "per_voice": spec.per_voice, "test_voices": spec.test_voices}
    clips = clips_to_synthesize(**common)
    how = _wave_augment(spec, settings)
    if how != "none":  # _train_source's clean clips
        more = EXTRA_VOICES if how.endswith("+voices") else ()
        clips += clips_to_synthesize(**common, snr_db=None, extra_voices=more)
    if settings.get("robustness"):
        clips += clips_to_synthesize(**common, snr_db=None, only_test=True)
    if clips == 0:
        return None
    workers, probes = 2, 4  # synthesize_spoken_digits's threads
    each = seconds_per_clip(probes)
    return Preparation(f"synthesizing {clips:,} clips with espeak-ng", clips * each / workers,
                       f"{probes} clips timed: {1000 * each:.0f} ms each, {workers} at a time")


def smoke_data(directory) -> str:
    """A tiny ``LABEL/*.wav`` set (two synthetic tones per label pitch, 0.5 s at 8 kHz) for the registry tests."""
    from pathlib import Path

    from scipy.io import wavfile

    root = Path(directory) / "tones"
    rng = np.random.default_rng(0)
    for label, freq in (("low", 300.0), ("high", 1200.0)):
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            t = np.arange(4000) / 8000
            wave = np.sin(2 * np.pi * freq * (1 + 0.02 * i) * t) * 0.5 + rng.normal(0, 0.01, t.shape)
            wavfile.write(root / label / f"{i:03d}.wav", 8000, (wave * 32767).astype(np.int16))
    return str(root)


RECIPE = register_recipe(Recipe(
    name="audio",
    description="AST on spoken digits (espeak-ng voices, held-out voices; vs MFCC + SVM), or --data DIR of LABEL/*.wav",
    model="ast-digits",
    build=build,
    data=SpokenWords,
    option_help={
        "baseline": "also fit the classical baseline, an SVM on MFCC statistics, and report baseline_accuracy",
        "eval_batch_size": "clips per batch when evaluating (memory only; the metrics do not change)",
        "num_mfcc": "MFCC coefficients the baseline reads (mean and std over time of each)",
        "robustness": "also test on speech the model never trained on (other synthesizers), generated digits only",
        "wave_augment": "the perturbation drawn afresh for every training clip: auto, none, noise, noise+resynth or "
                        "noise+resynth+voices",
    },
    options=dict(_OPTIONS),
    model_defaults={},
    train_defaults=dict(_TRAIN_DEFAULTS),
    evaluate_run=evaluate_run,
    headline=("test_accuracy", "test_accuracy_other_synth", "test_accuracy_babble_10db"),
    baselines={"MFCC + SVM": ("baseline_accuracy", "baseline_accuracy_other_synth", "baseline_accuracy_babble_10db")},
    preparation=preparation,
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "n_mels": 16, "clip_samples": 8000,
           "sample_rate": 8000, "baseline": False},
    smoke_data=smoke_data,
))
