"""The classification datasets: Fashion-MNIST directories, digits, MNIST-1D, and what ``--data`` names."""

import gzip
import random

import numpy as np
import pytest
import torch
from support import idx_bytes, write_fashion

from tokennet.data.text import DataError
from tokennet.data.vision_data import (
    FASHION_MNIST_DIRS,
    dataset_kind,
    find_fashion_mnist,
    load_digits,
    load_fashion_mnist,
    load_mnist1d,
    training_subset,
)


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


# -- train_size: nested subsets of the training split ------------------------------------------------
def test_training_subsets_are_nested_and_leave_the_test_split_alone():
    digits = load_digits()
    small, large = training_subset(digits, 100), training_subset(digits, 400)
    assert len(small.y_train) == 100 and len(large.y_train) == 400
    # exact on purpose: a subset selects rows of the same tensors (no arithmetic), so nesting is identity of rows
    assert torch.equal(small.x_train, large.x_train[:100]) and torch.equal(small.y_train, large.y_train[:100])
    assert small.x_test is digits.x_test and small.classes == digits.classes
    assert len(set(small.y_train.tolist())) == 10  # a shuffle, not the first 100 rows: every class is in it
    assert small.info["train_subset"] == {"size": 100, "of": 898, "seed": 0}
    assert training_subset(digits, 0) is digits and training_subset(digits, 898) is digits
    for n in (-1, 899):
        with pytest.raises(DataError, match=f"train_size={n}: digits has 898 training images"):
            training_subset(digits, n)
