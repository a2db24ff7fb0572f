"""Audio clips of any length: silence trimmed relative to the peak, windows that cover the clip, the cap,
the two ways of combining windows, and bad files as one clear error."""

import numpy as np
import pytest
import torch
from scipy.io import wavfile

from tokennet.errors import DataError
from tokennet.tokens.clips import (
    FRAME_SECONDS,
    MARGIN_SECONDS,
    combine_windows,
    fit_window,
    frame_levels_db,
    load_clip,
    prepare_clip,
    split_windows,
    trim_silence,
)

SR = 8000


def _word(seconds_before=0.7, word=0.3, seconds_after=1.0, level=0.5, floor=1e-5, seed=0):
    """A 440 Hz 'word' between stretches of near-silence (a faint noise floor, 94 dB below the tone)."""
    rng = np.random.default_rng(seed)
    n0, n1, n2 = (round(s * SR) for s in (seconds_before, word, seconds_after))
    x = rng.standard_normal(n0 + n1 + n2).astype(np.float32) * floor
    t = np.arange(n1) / SR
    x[n0:n0 + n1] += level * np.sin(2 * np.pi * 440 * t)
    return x, n0, n1


def test_frame_levels_are_the_rms_in_db():
    x = np.concatenate([np.full(80, 0.5), np.full(80, 0.05), np.full(40, 0.5)])
    np.testing.assert_allclose(frame_levels_db(x, 80), 20 * np.log10([0.5, 0.05, 0.5]), atol=1e-6)


@pytest.mark.parametrize("level", [0.5, 0.005])  # relative to the clip's own peak: quiet trims like loud
def test_trim_keeps_the_word_and_the_margins(level):
    x, start, n = _word(level=level, floor=level * 2e-5)
    y = trim_silence(x, SR)
    frame, margin = round(FRAME_SECONDS * SR), round(MARGIN_SECONDS * SR)
    assert n + 2 * margin <= len(y) <= n + 2 * margin + 2 * frame
    i = np.flatnonzero(np.abs(y) > level / 2)
    assert margin - frame <= i[0] <= margin + frame  # the word starts one margin in


def test_trim_threshold_is_relative_to_the_loudest_frame():
    x, _, n = _word(floor=0.0)
    x[:800] += 0.5 * 10 ** (-30 / 20) * np.sin(np.arange(800))  # a lead-in 30 dB down: kept at 40 dB
    assert len(trim_silence(x, SR)) > n + 800
    assert len(trim_silence(x, SR, threshold_db=20)) < n + 2 * round(MARGIN_SECONDS * SR) + 3 * 80


def test_silence_is_one_clear_error():
    with pytest.raises(DataError, match="silence only"):
        trim_silence(np.zeros(SR, np.float32), SR)
    with pytest.raises(DataError, match="silence only"):
        prepare_clip(np.full(SR, 1e-6, np.float32), SR, SR)
    with pytest.raises(DataError, match="no samples"):
        prepare_clip(np.zeros(0, np.float32), SR, SR)


def test_windows_cover_the_clip_and_the_last_ends_at_its_end():
    x = np.arange(2500, dtype=np.float32)
    w, s = split_windows(x, 1000, 300)
    assert s.tolist() == [0, 300, 600, 900, 1200, 1500]
    assert w.shape == (6, 1000) and w[-1, -1] == 2499
    for wi, si in zip(w, s, strict=True):
        np.testing.assert_array_equal(wi, x[si:si + 1000])
    short, s1 = split_windows(x[:400], 1000)
    assert short.shape == (1, 1000) and s1.tolist() == [0]
    np.testing.assert_array_equal(short[0, :400], x[:400])
    assert (short[0, 400:] == 0).all()


def test_fit_window_keeps_the_loudest_stretch():
    x, start, n = _word(seconds_before=0.2, word=1.5, seconds_after=0.2)
    x[round(0.9 * SR) + start:start + n] *= 0.1  # the second half of the long word is quieter
    y = fit_window(x, SR, SR // 2)
    assert len(y) == SR // 2 and np.abs(y).max() > 0.4


def test_combine_windows():
    lp = torch.log_softmax(torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 1.0, 0.0]]), -1)
    torch.testing.assert_close(combine_windows(lp, "confident"), lp[1])
    mean = combine_windows(lp, "mean")
    torch.testing.assert_close(mean.exp().sum(), torch.tensor(1.0))
    torch.testing.assert_close(mean, torch.log_softmax(lp.mean(0), -1))
    with pytest.raises(ValueError, match="one of"):
        combine_windows(lp, "vote")


def test_long_clips_are_capped_with_a_note():
    x = np.random.default_rng(0).standard_normal(5 * SR).astype(np.float32) * 0.1
    c = prepare_clip(x, SR, SR, max_seconds=2)
    assert c.seconds == 2 and len(c.notes) == 1 and "only its first 2 s" in c.notes[0]
    assert c.windows.shape[1] == SR and c.starts[-1] == SR


def test_ten_minute_file_is_windowed_and_capped(tmp_path):
    rate = 4000
    x = (np.random.default_rng(1).standard_normal(601 * rate) * 3000).astype(np.int16)
    wavfile.write(tmp_path / "long.wav", rate, x)
    c = load_clip(tmp_path / "long.wav", rate, rate)
    assert c.seconds == 600 and "600 s" in c.notes[0]
    assert len(c) == 1 + (600 - 1) * 4  # a window every quarter second


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        load_clip(tmp_path / "empty.wav", 16000, 16000)
    wavfile.write(tmp_path / "zero.wav", 16000, np.zeros(0, np.int16))  # a header and no samples
    with pytest.raises(DataError, match="no samples"):
        load_clip(tmp_path / "zero.wav", 16000, 16000)
    wavfile.write(tmp_path / "one_hz.wav", 1, (np.arange(50) * 100).astype(np.int16))
    with pytest.raises(DataError, match="1 Hz cannot hold speech"):
        load_clip(tmp_path / "one_hz.wav", 16000, 16000)
    wavfile.write(tmp_path / "silent.wav", 16000, np.zeros(16000, np.int16))
    with pytest.raises(DataError, match="silence only"):
        load_clip(tmp_path / "silent.wav", 16000, 16000)


def test_stereo_24_bit_file(tmp_path):
    sf = pytest.importorskip("soundfile")
    x, _, n = _word(floor=1e-4)
    stereo = np.stack([x, 0.5 * x], 1)
    sf.write(tmp_path / "s24.wav", stereo, SR, subtype="PCM_24")
    c = load_clip(tmp_path / "s24.wav", 16000, 16000)  # resampled to 16 kHz, channels averaged
    assert len(c) == 1 and c.notes == []
    assert np.abs(c.windows).max() == pytest.approx(0.75 * 0.5, rel=0.05)
    assert c.seconds == pytest.approx(n / SR + 2 * MARGIN_SECONDS, abs=0.03)
