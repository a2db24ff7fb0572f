"""1-D signal augmentation after the MNIST-1D generator: shapes kept, seeded, each change within its bounds."""

import pytest
import torch

from tokennet.data.signal_augment import (
    SignalAugment,
    correlated_noise,
    gaussian_noise,
    random_gain,
    random_roll,
    random_shear,
    random_stretch,
)
from tokennet.errors import ConfigError


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_every_change_keeps_the_shape_and_repeats_from_the_same_seed():
    x = torch.randn(16, 1, 40)
    changes = [lambda x, gen: random_roll(x, 5, gen), lambda x, gen: random_stretch(x, 0.2, gen),
               lambda x, gen: random_gain(x, 0.2, gen), lambda x, gen: gaussian_noise(x, 0.1, gen),
               lambda x, gen: correlated_noise(x, 0.3, gen), lambda x, gen: random_shear(x, 1.0, gen),
               SignalAugment(roll=20, scale=0.1, gain=0.2, noise=0.1, corr_noise=0.2, shear=1.0)]
    for change in changes:
        out = change(x, g(3))
        assert out.shape == x.shape and (out - x).abs().max() > 1e-3  # changed by far more than rounding
        torch.testing.assert_close(out, change(x, g(3)))
        assert (out - change(x, g(4))).abs().max() > 1e-3
    assert not SignalAugment().active and SignalAugment(noise=0.1).active


def test_roll_is_circular_and_bounded():
    x = torch.zeros(200, 2, 10)
    x[:, :, 5] = 1.0
    rolled = random_roll(x, 3, g())
    # exact by construction: a roll moves values (one 1.0 among zeros), it computes nothing
    assert (rolled.sum(-1) == 1).all() and torch.equal(rolled[:, 0], rolled[:, 1])  # channels move together
    where = rolled[:, 0].argmax(-1)
    assert where.min() == 2 and where.max() == 8  # 5 ± 3, every offset drawn
    edge = torch.zeros(50, 1, 10)
    edge[:, 0, 9] = 1.0
    assert (random_roll(edge, 3, g()).sum(-1) == 1).all()  # what falls off one end comes back at the other


def test_stretch_gain_noise_and_shear_stay_within_their_settings():
    ones = torch.ones(100, 1, 41)
    shrunk = random_stretch(ones, 0.5, g())
    assert shrunk.min() >= 0 and shrunk.max() <= 1 + 1e-6 and (shrunk[:, 0, 20] == 1).all()  # the centre stays
    assert (shrunk[:, 0, 0] < 1).any()  # a factor below 1 pulls zeros in from outside
    torch.testing.assert_close(random_stretch(ones, 0.0, g()), ones)
    ratio = random_gain(ones, 0.2, g())[:, 0, 0]
    assert ratio.min() >= 0.8 and ratio.max() <= 1.2 and ratio.std() > 0.05
    big = torch.zeros(64, 1, 400)
    assert gaussian_noise(big, 0.3, g()).std() == pytest.approx(0.3, rel=0.05)
    smooth = correlated_noise(big, 0.3, g())
    assert smooth.std() == pytest.approx(0.3, rel=0.1)
    neighbours = torch.corrcoef(torch.stack([smooth[:, 0, :-1].flatten(), smooth[:, 0, 1:].flatten()]))[0, 1]
    assert neighbours > 0.8  # smoothed over 2 samples: neighbours move together (white noise: ≈ 0)
    trend = random_shear(torch.zeros(100, 1, 11), 1.0, g())[:, 0]
    rise = trend[:, -1] - trend[:, 0]
    torch.testing.assert_close(trend.diff(dim=-1), (rise / 10)[:, None].expand(-1, 10))  # a straight line
    assert rise.abs().max() <= 1.0 and rise.std() > 0.2


def test_bad_settings_are_refused():
    for bad in ({"noise": -0.1}, {"roll": -1}, {"corr_noise": -1.0}, {"shear": -1.0}, {"gain": 1.0},
                {"scale": 1.0}, {"scale": -0.1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SignalAugment(**bad)
    SignalAugment(roll=39).check_length(40)
    with pytest.raises(ConfigError, match="roll=40 shifts by the whole signal"):
        SignalAugment(roll=40).check_length(40)
    with pytest.raises(ConfigError, match="1-D signals"):
        SignalAugment(noise=0.1)(torch.zeros(2, 1, 8, 8), g())
