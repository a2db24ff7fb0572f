"""`read_image`: image files and .npy arrays → (C, H, W) floats in [0, 1], with one-line errors."""

import numpy as np
import pytest
import torch
from PIL import Image

from tokennet.data.image_files import read_image, read_images
from tokennet.data.text import DataError


def test_rgb_png_round_trips_exactly(tmp_path):
    a = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(a).save(tmp_path / "x.png")
    x = read_image(tmp_path / "x.png")
    assert x.shape == (3, 5, 7) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.from_numpy(a).permute(2, 0, 1).float() / 255)


def test_grey_and_alpha(tmp_path):
    Image.fromarray(np.full((4, 4), 51, np.uint8)).save(tmp_path / "g.png")
    g = read_image(tmp_path / "g.png")
    assert g.shape == (1, 4, 4) and torch.allclose(g, torch.full_like(g, 0.2))
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[0, 0] = (255, 0, 0, 255)  # opaque red; the rest fully transparent → white
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    a = read_image(tmp_path / "a.png")
    assert a.shape == (3, 2, 2)
    torch.testing.assert_close(a[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(a[:, 1, 1], torch.ones(3))


def test_jpeg_reads(tmp_path):
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(tmp_path / "x.jpg")
    x = read_image(tmp_path / "x.jpg")
    assert x.shape == (3, 8, 8) and (x - 128 / 255).abs().max() < 0.02


@pytest.mark.parametrize("shape,want", [((6, 5), (1, 6, 5)), ((6, 5, 3), (3, 6, 5)), ((3, 6, 5), (3, 6, 5)),
                                        ((6, 5, 1), (1, 6, 5))])
def test_npy_layouts(tmp_path, shape, want):
    a = np.random.default_rng(1).random(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    x = read_image(tmp_path / "x.npy")
    assert x.shape == want
    assert float(x.sum()) == pytest.approx(float(a.sum()), rel=1e-5)


def test_npy_uint8_is_scaled(tmp_path):
    np.save(tmp_path / "x.npy", np.full((2, 2), 255, np.uint8))
    assert torch.equal(read_image(tmp_path / "x.npy"), torch.ones(1, 2, 2))


def test_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_image(tmp_path / "missing.png")
    with pytest.raises(DataError, match="is not a file"):
        read_image(tmp_path)
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    with pytest.raises(DataError, match="junk.png is not a readable image"):
        read_image(tmp_path / "junk.png")
    np.save(tmp_path / "big.npy", np.full((2, 2), 2.0, np.float32))
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        read_image(tmp_path / "big.npy")
    np.save(tmp_path / "c4.npy", np.zeros((4, 5, 5), np.float32))
    with pytest.raises(DataError, match="C = 1 or 3"):
        read_image(tmp_path / "c4.npy")
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(DataError, match="not a readable .npy"):
        read_image(tmp_path / "bad.npy")


def test_read_images_batches_checks_the_size_and_says_what_grey_does(tmp_path):
    Image.fromarray(np.full((4, 4), 51, np.uint8)).save(tmp_path / "g.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "c.png")
    Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(tmp_path / "big.png")
    x = read_images([tmp_path / "g.png", tmp_path / "c.png"], 4)
    assert x.shape == (2, 3, 4, 4) and torch.allclose(x[0], torch.full((3, 4, 4), 0.2))  # grey repeated
    with pytest.raises(DataError, match=r"g\.png: the model takes RGB images; this one has 1 channel \(grey\)"):
        read_images([tmp_path / "g.png"], 4, grey="refuse")
    with pytest.raises(DataError, match=r"big\.png: the model takes 4×4 images, got 5×4; resize it first"):
        read_images([tmp_path / "c.png", tmp_path / "big.png"], 4)
    with pytest.raises(DataError, match="no image given"):
        read_images([], 4)
    assert read_images([tmp_path / "g.png"], 4, channels=1).shape == (1, 1, 4, 4)
