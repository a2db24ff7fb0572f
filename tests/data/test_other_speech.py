"""Other synthesizers (Flite, Festival): they speak the digits, and the set is cached and evaluation-only."""

import shutil

import numpy as np
import pytest

from tokennet.data import other_speech as osp


@pytest.mark.skipif(shutil.which("flite") is None, reason="flite is not installed")
def test_flite_digits_set(tmp_path):
    x, rate = osp.flite_synth("seven", "kal16", 1.1)
    assert rate == 16000 and x.dtype == np.int16 and 0.3 < len(x) / rate < 2 and np.abs(x).max() > 1000
    path = osp.synthesize_other_digits(tmp_path, voices=("flite:kal16", "flite:slt"), per_voice=1)
    assert osp.synthesize_other_digits(tmp_path, voices=("flite:kal16", "flite:slt"), per_voice=1) == path  # cached
    ds = osp.load_other_digits(path)
    assert ds.x_test.shape == (20, 16000) and len(ds.y_train) == 0 and ds.y_test.tolist() == list(range(10)) * 2
    assert set(ds.test_voices) == {"flite:kal16", "flite:slt"}
    assert float(ds.x_test.abs().amax(1).min()) > 0.05


@pytest.mark.skipif(shutil.which("festival") is None, reason="festival is not installed")
def test_festival_speaks_in_one_process():
    out = osp.festival_synth_many(["one", "two"], "kal_diphone", [1.0, 1.2])
    assert len(out) == 2 and all(np.abs(x).max() > 1000 for x, _ in out)
    assert len(out[1][0]) > len(out[0][0])  # "two" stretched by 1.2 is longer than "one"
