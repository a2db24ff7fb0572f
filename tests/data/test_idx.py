"""`read_idx`: the (Fashion-)MNIST idx format, gzipped or not, with one-line errors for broken files."""

import gzip

import numpy as np
import pytest
from support import idx_bytes

from tokennet.data.idx import read_idx
from tokennet.data.text import DataError


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
