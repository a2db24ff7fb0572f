"""Both captioner forms: the prefix mask's promises, cached vs uncached decoding, bad images."""

import pytest
import torch
from support import assert_cached_decoding_agrees, assert_steps_match_teacher_forcing, random_model

from tokennet.models import create_model
from tokennet.models.captioner import CaptionerConfig, PrefixCaptioner

pytestmark = pytest.mark.usefixtures("one_thread")


FORMS = ["captioner-micro", "captioner-prefix-micro"]


@pytest.mark.parametrize("name", FORMS)
def test_forward_backward(name):
    m = random_model(name)
    x, y = m.example_input(2), m.example_targets(2)
    out = m(x, y)
    assert out.logits.shape == (2, x[1].shape[1], m.config.vocab_size)
    out.loss.backward()
    assert m.patch.weight.grad is not None and m.patch.weight.grad.abs().sum() > 0


def test_the_two_forms_have_the_same_depth():
    enc_dec, dec_only = create_model("captioner-micro"), create_model("captioner-prefix-micro")
    assert isinstance(dec_only, PrefixCaptioner)
    assert len(dec_only.decoder.layers()) == len(enc_dec.encoder.layers()) + len(enc_dec.decoder.layers())
    assert dec_only.decoder.blocks[0].cross_attn is None and enc_dec.decoder.blocks[0].cross_attn is not None


@pytest.mark.parametrize("name", FORMS)
def test_text_is_causal_and_sees_the_whole_image(name):
    m = random_model(name)
    images, _ = m.example_input(1)
    t1, t2 = torch.tensor([[1, 5, 6, 7]]), torch.tensor([[1, 5, 9, 9]])
    a, b = m((images, t1)).logits, m((images, t2)).logits
    torch.testing.assert_close(a[:, :2], b[:, :2])  # later words never reach earlier positions
    # Changing the bottom-right corner changes the first word's prediction: every text token sees every patch.
    im2 = images.clone()
    im2[..., -4:, -4:] = 1 - im2[..., -4:, -4:]
    c = m((im2, t1)).logits
    assert not torch.allclose(a[:, 0], c[:, 0])


def test_prefix_image_tokens_attend_to_each_other_but_not_to_text():
    m = random_model("captioner-prefix-micro")
    images, _ = m.example_input(1)
    P = m.config.num_patches
    a = m.attention_maps((images, torch.tensor([[1, 5, 6]])))["self"][0][0, 0]  # (P + T, P + T)
    assert (a[:P, :P] > 0).all()  # image ↔ image: bidirectional
    assert (a[:P, P:] == 0).all()  # image ↛ text
    assert (a[P:, :P] > 0).all()  # text → every image token
    assert torch.equal(a[P:, P:] > 0, torch.tril(torch.ones(3, 3, dtype=torch.bool)))  # text → earlier text


@pytest.mark.parametrize("name", FORMS)
def test_cached_and_uncached_decoding_agree(name):
    m = random_model(name)
    images, _ = m.example_input(3)
    assert_cached_decoding_agrees(m, images)


@pytest.mark.parametrize("name", FORMS)
def test_step_logits_match_teacher_forcing(name):
    m = random_model(name)
    images, _ = m.example_input(2)
    assert_steps_match_teacher_forcing(m, images, torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]]))


@pytest.mark.parametrize("name", FORMS)
def test_wrong_images_raise_clear_errors(name):
    m = random_model(name)
    tgt = torch.tensor([[1, 5]])
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, 16, 16\)"):
        m((torch.rand(1, 3, 20, 20), tgt))
    with pytest.raises(ValueError, match="expected images"):
        m((torch.rand(1, 1, 16, 16), tgt))
    with pytest.raises(ValueError, match="floating point"):
        m((torch.zeros(1, 3, 16, 16, dtype=torch.uint8), tgt))
    with pytest.raises(ValueError, match="maximum"):
        m((torch.rand(1, 3, 16, 16), torch.ones(1, 20, dtype=torch.long)))


def test_config_validation():
    with pytest.raises(ValueError, match="divide image_size"):
        CaptionerConfig(image_size=48, patch_size=5)
