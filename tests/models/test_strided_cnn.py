"""The all-convolutional CNN strided down to one unit: its field is the window (formula and autograd agree), nothing
outside the window reaches the answer, and a window the picture cannot hold is refused in one line."""

import pytest
import torch

from tokennet.errors import ConfigError
from tokennet.models.registry import create_model
from tokennet.models.strided_cnn import centre_window, reduction_kernels

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("grid", "kernels"), [(1, []), (2, [2]), (3, [3]), (5, [3, 2]), (13, [3, 2, 3]),
                                               (16, [2, 2, 2, 2]), (17, [3, 2, 2, 2])])
def test_reduction_kernels_take_the_grid_to_one_unit(grid, kernels):
    assert reduction_kernels(grid) == kernels
    size = grid
    for kernel in kernels:
        size = (size - kernel) // 2 + 1  # a valid convolution of stride 2
    assert size == 1


def _seen_pixels(model) -> torch.Tensor:
    """``(H, W)`` bool: the pixels the one unit's gradient reaches (pixels above the mean: with positive weights no
    ReLU is off)."""
    _, questions = model.example_input(1)
    x = (0.9 + 0.1 * torch.rand(1, 3, 64, 64)).requires_grad_(True)
    model.forward_features((x, questions)).sum().backward()
    return x.grad[0].abs().sum(0) != 0


@pytest.mark.parametrize(("window", "arch", "depth"), [(20, "plain", 1), (36, "resnet", 2), (52, "plain", 2),
                                                       (64, "plain", 1)])
def test_the_one_unit_sees_exactly_the_centred_window(window, arch, depth):
    """With positive weights (no unit is dead), the gradient of the answer reaches every pixel of the centred window
    and none outside it, whatever blocks of stride 1 and 1×1 head layers are added: the field is the window."""
    torch.manual_seed(0)
    m = create_model("vqa-cnn-unit", window=window, arch=arch, widths=[6], depths=[depth], norm="none",
                     head_layers=1).eval()
    with torch.no_grad():
        for name, param in m.named_parameters():
            if "trunk" in name or "head_layers" in name:
                param.copy_(param.abs() + 0.01)
    seen = _seen_pixels(m)
    start = (64 - window) // 2
    inside = torch.zeros(64, 64, dtype=torch.bool)
    inside[start:start + window, start:start + window] = True
    assert torch.equal(seen, inside)
    field = m.receptive_field()
    assert (field.size, field.start) == (window, start)
    assert m.forward_features(m.example_input(2)).shape[-2:] == (1, 1)  # strided down to one unit


def test_the_centre_window_is_the_middle_of_the_picture():
    x = torch.arange(36.0).view(1, 1, 6, 6)
    assert centre_window(x, 2).flatten().tolist() == [14.0, 15.0, 20.0, 21.0]
    assert torch.equal(centre_window(x, 6), x)


def test_pixels_outside_the_window_do_not_change_the_answer():
    torch.manual_seed(0)
    m = create_model("vqa-cnn-unit", window=36, widths=[8]).eval()
    x, questions = m.example_input(2)
    y = x.clone()
    y[..., :14, :] = torch.rand_like(y[..., :14, :])  # everything above the window changed
    y[..., :, 50:] = 0.0  # and to its right
    assert torch.allclose(m((x, questions)).logits, m((y, questions)).logits)


@pytest.mark.parametrize(("settings", "fragment"), [
    ({"window": 68}, "cannot see more than the picture"),
    ({"window": 30}, "multiple of stem_stride"),
    ({"window": 20, "stem_kernel": 6}, "patchify stem"),
    ({"readout": "mean", "window": 20, "widths": [8]}, "leave it unset"),
    ({"head_layers": -1}, "head_layers"),
])
def test_a_window_the_picture_cannot_hold_is_refused_in_one_line(settings, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        create_model("vqa-cnn-unit", **settings)
    assert "\n" not in str(err.value)


def test_the_unit_readout_trains_a_step_and_draws_its_answer_map():
    torch.manual_seed(0)
    m = create_model("vqa-cnn-unit", window=52, widths=[8], head_layers=1)
    inputs = m.example_input(4)
    out = m(inputs, m.example_targets(4))
    out.loss.backward()
    assert all(param.grad is not None for name, param in m.named_parameters() if "trunk.blocks" in name)
    maps, answers = m.eval().answer_map(inputs)
    assert maps.shape == (4, 1, 1) and answers.shape == (4,)
