"""The transformer built by hand (``tokennet demo counting``): exact counts and colours, by construction."""

import random

import pytest
import torch

from tokennet.demos import get_demo
from tokennet.demos.counting import (
    BETA,
    FEATURES,
    answer,
    hand_built_block,
    random_token_set,
    run_demo,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exact_on_1000_random_token_sets_including_none_and_one_animal():
    block = hand_built_block(max_count=20)
    rng = random.Random(0)
    seen = set()
    for t in range(1000):
        n = t % 21 if t < 42 else rng.randint(0, 20)  # every count 0 … 20 at least twice, then at random
        ts = random_token_set(rng, n, num_background=rng.randint(0, 24))
        count, _, colour, (row, _) = answer(block, ts)
        assert round(count) == n and abs(count - n) < 1e-3, (n, count)
        if n:
            assert colour == ts.colour_answer(), (ts.animals, ts.asked_species, colour)
        seen.add(n)
    assert {0, 1} <= seen and len(seen) == 21


def test_the_count_query_puts_one_over_k_plus_one_on_each_head_and_the_sink():
    block = hand_built_block()
    for n in (0, 1, 4, 9):
        ts = random_token_set(random.Random(n), n, num_background=10)
        _, _, _, (row, colour_row) = answer(block, ts)
        assert abs(float(row.sum()) - 1) < 1e-6  # a softmax row: it sums to 1
        for i, kind in enumerate(ts.kinds):
            want = 1 / (n + 1) if kind in ("head", "sink") else 0.0
            assert abs(float(row[i]) - want) < 1e-6, (kind, float(row[i]), want)
        if n:  # the colour query weighs the asked animal's tokens equally and nothing else
            mine = [i for i, k in enumerate(ts.kinds) if k in ("head", "body")
                    and ts.tokens[i, FEATURES["species"]].argmax() == ts.tokens[ts.colour_query,
                                                                                 FEATURES["query_species"]].argmax()]
            assert torch.allclose(colour_row[mine], torch.full((len(mine),), 1 / len(mine)), atol=1e-6)


@torch.no_grad()
def test_without_the_sink_softmax_cannot_count():
    """The reason for the sink: with it removed, the [count] query's row is 1/k on each of the k heads, so the
    sum of a value that is 1 on every head — the lecture's count — is 1 whatever k is."""
    block = hand_built_block()
    sums = []
    for n in (1, 3, 7):
        ts = random_token_set(random.Random(n), n, num_background=5)
        keep = [i for i, k in enumerate(ts.kinds) if k != "sink"]
        _, w = block(ts.tokens[keep][None], return_weights=True)
        row = w["self"][0, 0, keep.index(ts.count_query)]  # head 1, (N - 1,)
        sums.append(float((row * ts.tokens[keep, FEATURES["animal_head"]]).sum()))
    assert sums == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    assert BETA >= 20  # the leak e^(-β) per unselected token is far below the rounding of the count


def test_the_demo_writes_its_figure_and_metrics(tmp_path):
    m = run_demo(tmp_path, seed=0, trials=60)
    assert m["count_accuracy"] == 1.0 and m["colour_accuracy"] == 1.0
    assert (tmp_path / "counting_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert get_demo("counting").files == ("counting_attention.png", "counting.json")
