"""Helpers shared by several test modules (on the path via ``pythonpath = ["tests"]`` in pyproject.toml)."""

import gzip
import struct

import numpy as np

from tokennet.data.vision_data import FASHION_MNIST_FILES


def idx_bytes(a: np.ndarray) -> bytes:
    """``a`` in the idx format of (Fashion-)MNIST: magic (dtype code, ndim), big-endian sizes, data."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}
    head = bytes([0, 0, codes[a.dtype], a.ndim]) + b"".join(struct.pack(">I", d) for d in a.shape)
    return head + a.astype(a.dtype.newbyteorder(">")).tobytes()


def write_fashion(d, n_train=12, n_test=5, gz=True, size=28) -> dict[str, np.ndarray]:
    """Write a tiny random Fashion-MNIST directory (the four idx files) into ``d``; return the arrays."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, size, size), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, size, size), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for key, a in arrays.items():
        name = FASHION_MNIST_FILES[key]
        data = idx_bytes(a)
        if gz:
            (d / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (d / name).write_bytes(data)
    return arrays
