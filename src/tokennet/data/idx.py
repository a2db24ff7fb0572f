"""The idx file format of (Fashion-)MNIST (http://yann.lecun.com/exdb/mnist/): one typed n-d array.

A file is the magic number ``00 00 TYPE NDIM``, NDIM big-endian uint32 sizes, then the values,
big-endian; the datasets ship it gzipped. :func:`read_idx` reads both and names the file and the
problem when it cannot.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from .text import DataError

__all__ = ["read_idx"]

# idx type codes (http://yann.lecun.com/exdb/mnist/): the third magic byte; data are big-endian.
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.int16, 0x0C: np.int32, 0x0D: np.float32, 0x0E: np.float64}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (the MNIST format), gzipped or not: magic ``00 00 TYPE NDIM``, NDIM big-endian
    uint32 sizes, then the data, big-endian.

    Raises:
        DataError: a missing, truncated or corrupt file, with the path and what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"idx file {path} does not exist")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise DataError(f"{path} is a truncated or corrupt gzip file ({err}); download it again") from None
    if len(raw) < 4:
        raise DataError(f"{path} is truncated: {len(raw)} bytes, shorter than the 4-byte idx magic number")
    zero_a, zero_b, code, ndim = raw[:4]
    if zero_a or zero_b or code not in _IDX_TYPES or ndim == 0:
        raise DataError(f"{path} is not an idx file: magic bytes {raw[:4].hex(' ')}, expected 00 00 <type> <ndim> "
                        "(e.g. 00 00 08 03 for images, 00 00 08 01 for labels)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: its header needs {header} bytes, the file has {len(raw)}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[code]).newbyteorder(">")
    count = int(np.prod(dims, dtype=np.int64))
    need, have = count * dtype.itemsize, len(raw) - header
    if have < need:
        raise DataError(f"{path} is truncated: the header announces {'×'.join(map(str, dims))} values "
                        f"({need} bytes), the file holds {have}; download it again")
    if have > need:
        raise DataError(f"{path} is corrupt: {have - need} bytes follow the {'×'.join(map(str, dims))} values "
                        "its header announces")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(dims).astype(dtype.newbyteorder("="))
