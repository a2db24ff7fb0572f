"""AST: a ViT over the log-mel spectrogram; the config derives the image from the audio settings."""

import pytest
import torch

from tokennet.errors import ConfigError, DataError
from tokennet.models import create_model
from tokennet.models.ast import spec_augment
from tokennet.tokens.audio import LogMelSpectrogram


def tiny(name="ast-digits-patches", **kw):
    return create_model(name, dim=32, num_layers=1, num_heads=2, **kw)


def test_image_is_the_spectrogram_and_patches_overlap():
    m = tiny()
    c = m.config
    assert c.image_size == [40, 101] and c.in_channels == 1 and c.family == "ast"
    assert c.grid == (9, 25)  # 8×8 patches at stride 4 over 40 × 101 (padded to 104 frames)
    assert tiny("ast-digits").config.grid == (5, 13)  # the conv stem: ⌈40/8⌉ × ⌈101/8⌉ cells
    with pytest.raises(ConfigError, match="leave it unset"):
        tiny(image_size=[40, 50])
    with pytest.raises(ConfigError, match="in_channels"):
        tiny(in_channels=3)
    with pytest.raises(ConfigError, match="sample_rate"):
        tiny(sample_rate=0)


def test_waveform_and_precomputed_spectrogram_give_the_same_logits():
    torch.manual_seed(0)
    m = tiny().eval()
    x = m.example_input(3)
    s = m.spectrogram_image(x)
    ref = LogMelSpectrogram(16000, 400, 160, 40, top_db=60.0)(x)
    ref = (ref - ref.mean((1, 2), keepdim=True)) / (ref.std((1, 2), keepdim=True) + 1e-5)
    torch.testing.assert_close(s, ref)
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, m(s[:, None]).logits)
        short = m(x[:, :8000]).logits  # shorter clips are zero-padded
        torch.testing.assert_close(short, m(torch.cat([x[:, :8000], torch.zeros(3, 8000)], 1)).logits)
    with pytest.raises(DataError, match="maximum"):
        m(torch.zeros(1, 16001))
    with pytest.raises(DataError, match="spectrograms"):
        m(torch.zeros(1, 1, 30, 101))


def test_spec_augment_masks_bands_and_spans_only_in_training():
    torch.manual_seed(0)
    s = torch.ones(64, 40, 101)
    out = spec_augment(s, 6, 12, 2)
    zero_rows = (out == 0).all(2).sum(1)  # (B,) masked mel bins: whole rows
    zero_cols = (out == 0).all(1).sum(1)  # (B,) masked frames: whole columns
    assert zero_rows.max() <= 12 and zero_cols.max() <= 24 and zero_rows.sum() > 0 and zero_cols.sum() > 0
    assert torch.equal(spec_augment(s, 0, 0, 2), s)
    m = tiny(freq_mask=6, time_mask=12)
    x = m.example_input(2)
    m.eval()
    with torch.no_grad():
        a, b = m(x).logits, m(x).logits
    torch.testing.assert_close(a, b)  # evaluation: no masks


def test_mel_normalization_removes_a_fixed_filter():
    """A fixed filter adds (nearly) a constant to each band's log energy: per-band mean normalization removes
    most of it (the clip-wide standardization does not)."""
    from tokennet.data.audio_augment import equalize

    torch.manual_seed(0)
    wave = torch.randn(1, 16000) * (1 + torch.sin(torch.linspace(0, 20, 16000)))  # a pulsing noise
    tilted = equalize(wave[0], 3.0, 0.0, 1000.0, 16000)[None]  # a tilt: nearly constant within a band
    diff = {}
    for normalize in ("mel", "clip"):
        m = create_model("ast-digits", num_classes=10, normalize=normalize)
        diff[normalize] = float((m.spectrogram_image(wave) - m.spectrogram_image(tilted)).abs().mean())
    # measured: mel 0.066, clip 0.29 (what is left: the tilt is not constant inside the widest low bands)
    assert diff["mel"] < diff["clip"] / 3, diff


def test_frequency_warp_moves_a_tone_up_only_in_training():
    from tokennet.models.ast import freq_warp

    m = create_model("ast-digits", num_classes=10, freq_warp=0.2, freq_mask=0, time_mask=0)
    c = m.band_centres()
    assert (c[1:] > c[:-1]).all() and 0 < float(c[0]) < 100 and 7000 < float(c[-1]) < 8000
    spec = torch.zeros(2, 40, 3)
    spec[:, 20] = 1.0  # a tone in band 20
    w = freq_warp(spec, c, torch.tensor([1.0, 1.15]))
    torch.testing.assert_close(w[0], spec[0])
    assert int(w[1, :, 0].argmax()) > 20  # α > 1 scales the formants up
    x = m.example_input(2)
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, m(x).logits)  # evaluation is not warped (deterministic)
    with pytest.raises(Exception, match="freq_warp"):
        create_model("ast-digits", num_classes=10, freq_warp=0.7)
