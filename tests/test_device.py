"""``tokennet.device.one_thread``: one intra-op thread inside, the count before it restored after, also when the block
raises (the recipes' baselines, the claims and the report's panels run inside it)."""

from __future__ import annotations

import pytest
import torch

from tokennet.device import one_thread


def test_one_thread_inside_and_the_count_restored_after_also_on_an_error():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="inside"), one_thread():
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
