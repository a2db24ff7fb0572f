import gzip
import random

import numpy as np
import pytest
import torch
from support import idx_bytes, write_fashion

from tokennet.data.text import DataError
from tokennet.data.vision import (
    FASHION_MNIST_DIRS,
    Augment,
    ImageBatches,
    dataset_kind,
    evaluate_classifier,
    find_fashion_mnist,
    load_digits,
    load_fashion_mnist,
    load_mnist1d,
    mixup,
    random_affine,
    random_erase,
    random_flip,
    random_translate,
    read_idx,
)


# -- idx files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, dtype, gz):
    a = (np.arange(2 * 3 * 4) * 7 - 20).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    data = idx_bytes(a)
    p = tmp_path / ("x.idx.gz" if gz else "x.idx")
    p.write_bytes(gzip.compress(data) if gz else data)
    b = read_idx(p)
    assert b.shape == a.shape and b.dtype == a.dtype
    np.testing.assert_array_equal(a, b)


def test_read_idx_bad_files(tmp_path):
    good = idx_bytes(np.zeros((3, 4, 4), dtype=np.uint8))
    p = tmp_path / "f"
    p.write_bytes(good[:-5])
    with pytest.raises(DataError, match=r"f is truncated: the header announces 3×4×4 values \(48 bytes\), "
                                        r"the file holds 43"):
        read_idx(p)
    p.write_bytes(good[:10])
    with pytest.raises(DataError, match="truncated: its header needs 16 bytes"):
        read_idx(p)
    p.write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="shorter than the 4-byte idx magic"):
        read_idx(p)
    p.write_bytes(b"GIF89a" + good)
    with pytest.raises(DataError, match="not an idx file: magic bytes 47 49 46 38, expected 00 00 <type> <ndim>"):
        read_idx(p)
    p.write_bytes(good + b"\x00\x01")
    with pytest.raises(DataError, match="corrupt: 2 bytes follow"):
        read_idx(p)
    p.write_bytes(gzip.compress(good)[:-12])
    with pytest.raises(DataError, match="truncated or corrupt gzip"):
        read_idx(p)
    with pytest.raises(DataError, match="does not exist"):
        read_idx(tmp_path / "missing")


# -- Fashion-MNIST directories ------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [True, False])
def test_load_fashion_mnist_from_a_directory(tmp_path, gz):
    arrays = write_fashion(tmp_path / "fm", gz=gz)
    ds = load_fashion_mnist(tmp_path / "fm")
    assert ds.x_train.shape == (12, 1, 28, 28) and ds.x_test.shape == (5, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and 0 <= ds.x_train.min() and ds.x_train.max() <= 1
    torch.testing.assert_close(ds.x_train[3, 0] * 255, torch.tensor(arrays["train_images"][3], dtype=torch.float32))
    assert ds.y_test.tolist() == arrays["test_labels"].tolist()
    assert ds.num_classes == 10 and ds.image_size == 28 and ds.in_channels == 1
    assert dataset_kind(str(tmp_path / "fm")) == "fashion-mnist"


def test_fashion_mnist_directory_errors(tmp_path):
    with pytest.raises(DataError, match=r"Fashion-MNIST directory .*nope does not exist \(expected a directory with "
                                        r"train-images-idx3-ubyte\[.gz\]"):
        load_fashion_mnist(tmp_path / "nope")
    d = tmp_path / "fm"
    write_fashion(d)
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="has no t10k-labels-idx1-ubyte"):
        load_fashion_mnist(d)
    write_fashion(d, n_test=4)
    (d / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(5, dtype=np.uint8))))
    with pytest.raises(DataError, match="has 4 images but .*t10k-labels-idx1-ubyte.gz has 5 labels"):
        load_fashion_mnist(d)
    (d / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.full(4, 12, dtype=np.uint8))))
    with pytest.raises(DataError, match="has label 12; expected 0..9"):
        load_fashion_mnist(d)
    train = d / "train-images-idx3-ubyte.gz"
    train.write_bytes(train.read_bytes()[: train.stat().st_size // 2])  # a half-downloaded file
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz is a truncated or corrupt gzip"):
        load_fashion_mnist(d)


def test_data_names():
    assert dataset_kind(None) == dataset_kind("digits") == "digits"
    assert dataset_kind("fashion-mnist") == dataset_kind("Fashion_MNIST") == "fashion-mnist"
    assert dataset_kind("mnist1d") == "mnist1d"
    with pytest.raises(DataError, match="unknown data 'cifar'"):
        dataset_kind("cifar")
    with pytest.raises(DataError, match="does not exist"):
        dataset_kind("./no/such/dir")


@pytest.mark.skipif(not any(__import__("pathlib").Path(d).is_dir() for d in FASHION_MNIST_DIRS),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist():
    ds = load_fashion_mnist()
    assert find_fashion_mnist().is_dir()
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10


# -- digits and MNIST-1D ------------------------------------------------------------------------------
def test_digits_split_is_sklearns_example_split():
    ds = load_digits()
    assert ds.x_train.shape == (898, 1, 8, 8) and ds.x_test.shape == (899, 1, 8, 8)
    assert ds.x_train.max() == 1.0 and ds.x_train.min() == 0.0
    assert ds.image_size == 8 and ds.num_classes == 10


def test_mnist1d_is_generated_and_leaves_global_rngs_alone():
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()
    ds = load_mnist1d()
    assert ds.x_train.shape == (4000, 1, 40) and ds.x_test.shape == (1000, 1, 40)
    assert ds.image_size == [40] and set(ds.y_train.unique().tolist()) == set(range(10))
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)
    assert random.getstate() == py_state
    torch.testing.assert_close(load_mnist1d().x_test, ds.x_test)  # the same dataset every time


# -- augmentation -------------------------------------------------------------------------------------
def g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_translate_moves_content_by_at_most_the_shift():
    x = torch.zeros(64, 1, 8, 8)
    x[:, 0, 4, 4] = 1.0
    y = random_translate(x, 2, g())
    assert y.shape == x.shape and (y.sum((1, 2, 3)) == 1).all()  # nothing falls off at ±2
    pos = y[:, 0].flatten(1).argmax(1)
    rows, cols = pos // 8, pos % 8
    assert rows.min() == 2 and rows.max() == 6 and cols.min() == 2 and cols.max() == 6
    torch.testing.assert_close(random_translate(x, 2, g(1)), random_translate(x, 2, g(1)))
    s = torch.zeros(16, 1, 10)
    s[:, 0, 5] = 1.0
    shifted = random_translate(s, 3, g()).argmax(-1)
    assert shifted.min() >= 2 and shifted.max() <= 8


def test_flip_erase_affine():
    x = torch.rand(32, 1, 8, 8)
    f = random_flip(x, g())
    flipped = (f == x.flip(-1)).flatten(1).all(1)
    assert 0 < flipped.sum() < 32 and ((f == x).flatten(1).all(1) | flipped).all()
    e = random_erase(torch.ones(200, 1, 8, 8), g(), p=0.5)
    erased = (e == 0).flatten(1).any(1)
    assert 60 < erased.sum() < 140 and e[~erased].eq(1).all()
    torch.testing.assert_close(random_affine(x, g(), degrees=0, scale=0), x)
    assert not torch.allclose(random_affine(x, g(), degrees=15, scale=0.1), x)
    aug = Augment(translate=1, flip=True, erase=0.25, rotate=10, scale=0.1)
    torch.testing.assert_close(aug(x, g(3)), aug(x, g(3)))
    with pytest.raises(ValueError, match="translate"):
        Augment(translate=-1)


def test_mixup_mixes_inputs_and_labels_alike():
    x = torch.rand(8, 1, 4, 4)
    y = torch.arange(8) % 3
    xm, ym = mixup(x, y, 3, 0.4, g())
    assert ym.shape == (8, 3)
    torch.testing.assert_close(ym.sum(1), torch.ones(8))
    lam = ym.max(1).values.min()
    assert 0.5 <= lam <= 1


# -- batches ----------------------------------------------------------------------------------------
def test_batches_are_epochs_and_pure_functions_of_the_index():
    x = torch.arange(10, dtype=torch.float32)[:, None, None].expand(10, 1, 3).clone()  # item i holds i
    y = torch.arange(10)
    src = ImageBatches(x, y, 3, seed=5)
    assert src.steps_per_epoch == 3
    epoch0 = torch.cat([src.batch(i)[1] for i in range(3)])
    assert len(set(epoch0.tolist())) == 9  # 9 distinct items, one dropped
    epoch1 = torch.cat([src.batch(i)[1] for i in range(3, 6)])
    assert not torch.equal(epoch0, epoch1)
    other = ImageBatches(x, y, 3, seed=5, augment=None)
    for i in (7, 0, 4):  # any order: batch i never depends on what was drawn before
        torch.testing.assert_close(other.batch(i), src.batch(i))
    aug = ImageBatches(x, y, 3, seed=5, augment=Augment(translate=1))
    torch.testing.assert_close(aug.batch(4), ImageBatches(x, y, 3, seed=5, augment=Augment(translate=1)).batch(4))
    mixed = ImageBatches(x, y, 3, seed=5, mixup=0.2, num_classes=10).batch(2)[1]
    assert mixed.shape == (3, 10)
    with pytest.raises(DataError, match="batch_size must be in 1..10"):
        ImageBatches(x, y, 11)


def test_evaluate_classifier():
    class Oracle(torch.nn.Module):  # predicts the class stored in the first pixel, confidently
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, targets=None):
            from tokennet.models import Output

            return Output(torch.nn.functional.one_hot(x[:, 0, 0].long(), 4).float() * 20)

    x = torch.tensor([0, 1, 2, 3, 1], dtype=torch.float32)[:, None, None]
    y = torch.tensor([0, 1, 2, 0, 1])
    m = evaluate_classifier(Oracle(), x, y, batch_size=2)
    assert m["test_accuracy"] == pytest.approx(0.8)
    assert m["test_loss"] == pytest.approx(20 / 5, abs=1e-3)
