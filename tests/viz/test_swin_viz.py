"""Swin's pictures: the rollout through patch merging, and the files ``tokennet viz`` writes."""

import torch

from tokennet.viz.swin import merge_matrix, swin_rollout


def test_merge_matrix_averages_each_merged_tokens_children():
    m = merge_matrix((3, 4), (2, 2))  # → a 2 × 2 grid; the bottom row has no second row of children
    assert m.shape == (4, 12)
    torch.testing.assert_close(m.sum(1), torch.ones(4))
    assert m[0, [0, 1, 4, 5]].tolist() == [0.25] * 4 and m[2, [8, 9]].tolist() == [0.5, 0.5]


def test_rollout_of_uniform_attention_is_uniform_over_the_first_stage():
    grids = [(4, 4), (4, 4), (2, 2)]
    maps = [torch.full((2, 16, 16), 1 / 16), torch.full((2, 16, 16), 1 / 16), torch.full((2, 4, 4), 1 / 4)]
    last, rel = swin_rollout(maps, grids, (2, 2))
    assert last.shape == rel.shape == (16,)
    torch.testing.assert_close(rel, torch.full((16,), 1 / 16))
    torch.testing.assert_close(rel.sum(), torch.tensor(1.0))
    # attention on one last-stage token sends the relevance to its four children (and the residual elsewhere)
    peaked = torch.zeros(2, 4, 4)
    peaked[:, :, 3] = 1.0
    _, rel = swin_rollout([torch.eye(16)[None].expand(2, 16, 16), peaked], [(4, 4), (2, 2)], (2, 2))
    assert set(rel.topk(4).indices.tolist()) == {10, 11, 14, 15}
