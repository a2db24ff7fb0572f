import math

import pytest
import torch

from tokennet.position import ALiBi, alibi_bias, alibi_slopes


def press_reference_slopes(n):
    """get_slopes of the reference code of Press et al. (ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + press_reference_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2]


def test_slopes_h8_exact():
    assert alibi_slopes(8).tolist() == [1 / 2**h for h in range(1, 9)]


@pytest.mark.parametrize("H", [1, 2, 4, 6, 8, 12, 16, 20, 24])
def test_slopes_match_reference(H):
    torch.testing.assert_close(alibi_slopes(H), torch.tensor(press_reference_slopes(H)))


def test_bias_is_linear_in_distance():
    H, n = 8, 9
    bias = alibi_bias(H, n, dtype=torch.float64)
    assert bias.shape == (H, n, n)
    torch.testing.assert_close(bias.diff(n=2, dim=-1), torch.zeros(H, n, n - 2, dtype=torch.float64))
    slopes = alibi_slopes(H).double()
    torch.testing.assert_close(bias.diff(dim=-1), slopes[:, None, None].expand(H, n, n - 1))
    assert torch.equal(bias.diagonal(dim1=-2, dim2=-1), torch.zeros(H, n, dtype=torch.float64))
    i, j = 6, 2
    assert bias[2, i, j].item() == pytest.approx(-slopes[2].item() * (i - j))


def test_queries_are_the_last_positions():
    H = 4
    full = alibi_bias(H, 10)
    part = alibi_bias(H, 3, 10)
    assert part.shape == (H, 3, 10)
    torch.testing.assert_close(part, full[:, -3:])
    step = alibi_bias(H, 1, 10)  # one decoding step with 9 cached keys: last key gets 0 bias
    assert torch.equal(step[:, 0, -1], torch.zeros(H))


def test_module_matches_function():
    alibi = ALiBi(6)
    assert "slopes" not in alibi.state_dict()
    torch.testing.assert_close(alibi(5), alibi_bias(6, 5))
    torch.testing.assert_close(alibi(2, 7), alibi_bias(6, 2, 7))


def test_bad_input():
    with pytest.raises(ValueError, match="n_q <= n_k"):
        alibi_bias(4, 5, 3)
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="num_heads"):
        ALiBi(0)
