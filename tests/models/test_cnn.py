"""CNNs: the receptive field (the formula and autograd agree), the lecture's x1 … x7 claim, the family."""

import pytest
import torch
from torch import nn

from tokennet.attention.multihead import MultiHeadAttention
from tokennet.models.cnn import CNN, CNNConfig, receptive_field
from tokennet.models.registry import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _reach(fn, n: int) -> torch.Tensor:
    """``R[i, j]``: output ``i`` has a non-zero gradient with respect to input ``j`` (over ``n`` inputs)."""
    x = torch.randn(1, n, requires_grad=True)
    y = fn(x)  # (m,)
    rows = []
    for i in range(len(y)):
        (g,) = torch.autograd.grad(y[i], x, retain_graph=True)
        rows.append(g[0] != 0)
    return torch.stack(rows)


def test_the_lecture_claim_no_output_of_a_depth_2_length_3_conv_sees_both_x1_and_x7():
    torch.manual_seed(0)
    for padding in (0, 1):  # "valid" (3 outputs) and "same" (7 outputs)
        convs = nn.Sequential(nn.Conv1d(1, 4, 3, padding=padding), nn.ReLU(), nn.Conv1d(4, 1, 3, padding=padding))
        with torch.no_grad():  # positive weights and biases: no unit is dead, every path carries gradient
            for p in convs.parameters():
                p.copy_(p.abs() + 0.1)
        reach = _reach(lambda x, convs=convs: convs(x[:, None])[0, 0], 7)  # (outputs, 7)
        assert not (reach[:, 0] & reach[:, 6]).any(), "some output saw both x1 and x7"
        assert reach.sum(1).max() == 5 == receptive_field([(3, 1), (3, 1)]).size  # each output sees 5 inputs
    # One attention layer: every output depends on every input, x1 and x7 included.
    attn = MultiHeadAttention(4, 1)
    embed = nn.Linear(1, 4)
    reach = _reach(lambda x: attn(embed(x[0, :, None])[None])[0].sum(-1), 7)
    assert reach.all()


@pytest.mark.parametrize(("layers", "size", "jump"), [
    ([(3, 1), (3, 1)], 5, 1),  # the lecture's stack
    ([(3, 1)] * 4, 9, 1),
    ([(3, 2), (3, 2), (3, 2)], 15, 8),
    ([(3, 1, 2), (3, 1, 4)], 13, 1),  # dilation: 1 + 2·2 + 4·2
    ([(4, 4), (3, 1), (3, 2)], 20, 8),  # the shallow VQA CNN: a patchify stem, two convs
])
def test_receptive_field_formula(layers, size, jump):
    rf = receptive_field(layers)
    assert (rf.size, rf.jump) == (size, jump)


@pytest.mark.parametrize("arch", ["plain", "resnet"])
def test_receptive_field_matches_autograd_on_the_trunk(arch):
    """The field the formula gives is exactly the set of input pixels the centre unit's gradient reaches."""
    torch.manual_seed(0)
    m = CNN(CNNConfig(arch=arch, in_channels=1, image_size=48, widths=[4, 4], depths=[1, 1], norm="none",
                      stem_kernel=3, stem_stride=1)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.abs() + 0.05)  # no ReLU is ever off: every path in the field carries gradient
    x = torch.rand(1, 1, 48, 48, requires_grad=True)
    h = m.forward_features(x)  # (1, C, h, w)
    cy, cx = h.shape[2] // 2, h.shape[3] // 2
    (g,) = torch.autograd.grad(h[0, :, cy, cx].sum(), x)
    rows = (g[0, 0] != 0).any(1).nonzero().flatten()
    assert len(rows) == m.receptive_field().size == rows.max() - rows.min() + 1


def _touches_both_corner_cells(field, units: int) -> bool:
    """Whether some unit along one axis sees pixels of both corner cells of the 4×4 grid (pixels 0–15 and 48–63):
    unit ``i`` sees ``[start + i·jump, start + i·jump + size)``."""
    return any(field.start + i * field.jump < 16 and field.start + i * field.jump + field.size > 48
               for i in range(units))


def test_the_vqa_cnns_fields_one_covers_the_image_the_other_not_two_corners():
    deep, shallow = create_model("vqa-cnn"), create_model("vqa-cnn-shallow")
    assert deep.receptive_field().covers(64) and _touches_both_corner_cells(deep.receptive_field(), deep.map_side)
    # The baselines differ only in stages (field): 36 px, less than the 48 px from one corner cell to the next, and
    # placed so that no unit of the 4×4 map touches two corner cells.
    assert shallow.receptive_field().size == 36 < 48
    assert not _touches_both_corner_cells(shallow.receptive_field(), shallow.map_side)
    assert deep.config.widths[:3] == shallow.config.widths and len(deep.config.widths) == 4


def test_cnn_classifier_forward_backward_and_class_activation_map():
    m = create_model("cnn-digits", num_classes=10)
    x, y = m.example_input(3), m.example_targets(3)
    out = m(x, y)
    assert out.logits.shape == (3, 10) and out.loss.dim() == 0
    out.loss.backward()
    m.eval()
    with torch.no_grad():
        cam, cls = m.class_activation_map(x)
        h = m.forward_features(x)
        # The logit is the mean of the units' votes plus the bias: GAP + linear is a sum of local votes.
        logit = cam.mean((1, 2)) + m.head.bias[cls]
        torch.testing.assert_close(logit, m.forward_head(h)[torch.arange(3), cls])


def test_config_errors():
    with pytest.raises(ValueError, match="one entry per stage"):
        CNNConfig(widths=[8, 16], depths=[1])
    with pytest.raises(ValueError, match="odd"):
        CNNConfig(kernel_size=4)
    with pytest.raises(ValueError, match="arch"):
        CNNConfig(arch="vgg")
