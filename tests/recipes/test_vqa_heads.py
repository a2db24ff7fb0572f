"""Each head's mean attention distance and grouping (tasks/vqa_heads.py), held to a fake model whose heads are known
and to a tiny real one; nothing is measured where patches never meet."""

import math

import pytest
import torch

from tokennet.data.vqa import AnimalQuestions, object_patches
from tokennet.models.registry import create_model
from tokennet.models.vqa import VQATransformerConfig
from tokennet.tasks.vqa_heads import head_statistics, head_summary, patch_distances, patches_meet

pytestmark = pytest.mark.usefixtures("one_thread")


def test_patch_distances_are_between_patch_centres_in_pixels():
    dist = patch_distances((2, 2), 8)
    assert dist[0].tolist() == pytest.approx([0.0, 8.0, 8.0, 8 * math.sqrt(2)])
    assert torch.equal(dist, dist.T)


class ThreeHeads(torch.nn.Module):
    """One layer, three heads over 8-px patches: head 0 looks at its own patch, head 1 at every patch alike,
    head 2 at its own animal's patches (elsewhere alike)."""

    def __init__(self, qa):
        super().__init__()
        self.config = VQATransformerConfig(vocab_size=40, max_question_len=16, patch_size=8, modality_mask="full")
        self.qa = qa
        self.w = torch.nn.Parameter(torch.zeros(1))

    def attention_maps(self, inputs):
        images, _ = inputs
        cfg = self.config
        n, N = cfg.num_text, cfg.num_patches
        a = torch.zeros(len(images), 3, n + N, n + N)
        a[:, 0, n:, n:] = torch.eye(N)
        a[:, 1, n:, n:] = 1.0 / N
        for b, x in enumerate(images):
            i = next(j for j in range(len(self.qa)) if torch.equal(self.qa.images[j], x))
            a[b, 2, n:, n:] = 1.0
            for box in self.qa.boxes[i] + self.qa.other_boxes[i]:
                patches = object_patches([box], cfg.grid, cfg.patch_size)
                for src in patches:
                    a[b, 2, n + src, [n + p for p in patches]] = 50.0
            a[b, 2, n:, n:] /= a[b, 2, n:, n:].sum(-1, keepdim=True)
        return {"self": [a]}


def test_the_heads_own_patch_uniform_and_grouped_are_told_apart():
    spec = AnimalQuestions(test_size=30).filled()
    qa = spec.held_out()
    stats = head_statistics(ThreeHeads(qa), qa, spec.words, limit=12)
    own, uniform, grouped = stats["distance"][0]
    assert own == 0.0 and uniform == pytest.approx(stats["uniform_distance"], abs=1e-3) and 0 < grouped < uniform
    assert stats["patch_share"][0] == pytest.approx([1.0, 1.0, 1.0])
    g_own, g_uniform, g_grouped = stats["grouping"][0]
    assert g_own == 0.0 and g_uniform == pytest.approx(1.0, abs=1e-3) and g_grouped > 10
    flat = head_summary(stats)
    assert flat["head_distance_layer0_head1"] == uniform and flat["head_distance_min"] == 0.0
    assert flat["head_grouping_max"] == g_grouped


def test_a_tiny_model_is_measured_only_where_its_patches_meet():
    spec = AnimalQuestions(test_size=20).filled()
    qa = spec.held_out()
    kw = dict(patch_size=8, vocab_size=len(spec.words) + 1, max_question_len=12, num_answers=len(spec.answers),
              dim=32, num_heads=2, num_layers=2)
    torch.manual_seed(0)
    full = create_model("vqa-transformer", **kw)
    stats = head_statistics(full, qa, spec.words, limit=8)
    assert sorted(stats["distance"]) == [0, 1] and all(len(heads) == 2 for heads in stats["distance"].values())
    for heads in stats["distance"].values():  # untrained: close to attending to every patch alike
        assert all(abs(value - stats["uniform_distance"]) < 0.2 * stats["uniform_distance"] for value in heads)
    assert all(0 < share < 1 for heads in stats["patch_share"].values() for share in heads)  # words take some
    local = create_model("vqa-transformer", modality_mask="patch-local", **kw)
    assert not patches_meet(local.config) and head_statistics(local, qa, spec.words) == {} == head_summary({})


def test_the_report_says_how_far_the_heads_look():
    from types import SimpleNamespace

    from tokennet.viz.report.vqa import _comparison

    metrics = {"exact_match": 50.0, "head_distance_min": 3.5, "head_distance_max": 21.25, "head_grouping_max": 2.5}
    page = _comparison(SimpleNamespace(metrics=metrics))
    assert "Head by head" in page and "3.5" in page and "21.25" in page and "2.5" in page
    assert "Head by head" not in _comparison(SimpleNamespace(metrics={"exact_match": 50.0}))
