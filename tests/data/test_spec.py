"""Data specs: what a run's data is, as a type that round-trips through run.json."""

import dataclasses

import pytest

from tokennet.data.spec import DataSpec, legacy_spec, list_data, spec_class, spec_from_dict
from tokennet.errors import DataError


@pytest.mark.parametrize("kind", list_data())
def test_every_spec_round_trips_through_its_dict(kind):
    cls = spec_class(kind)
    spec = cls()
    d = spec.to_dict()
    assert d["kind"] == kind
    assert spec_from_dict(d) == spec
    assert isinstance(spec.describe(), str) and spec.describe().startswith(kind)
    assert dataclasses.is_dataclass(spec) and isinstance(spec, DataSpec)


def test_a_spec_refuses_fields_it_does_not_have():
    with pytest.raises(DataError, match="unknown 'text' data field"):
        spec_from_dict({"kind": "text", "source": "x", "vocab": 3})
    with pytest.raises(DataError, match="unknown data kind"):
        spec_from_dict({"kind": "nope"})
    with pytest.raises(DataError, match="kind"):
        spec_from_dict({"source": "x"})


def test_settings_become_fields_and_derived_fields_are_not_settings():
    cls = spec_class("spoken-words")
    assert "labels" not in cls.setting_names() and "source" not in cls.setting_names()
    spec = cls.from_settings("DIR", {"seed": 3, "per_voice": 2, "labels": ["ignored"], "lr": 1.0})
    assert (spec.source, spec.seed, spec.per_voice, spec.labels) == ("DIR", 3, 2, [])


def test_legacy_runs_get_the_spec_of_their_time():
    text = legacy_spec("gpt-char", None, {"val_fraction": 0.2})
    assert (text.kind, text.source, text.val_fraction) == ("text", "python-docs", 0.2)
    graphs = legacy_spec("graph", None, {"seed": 1, "test_size": 7})
    assert graphs.kind == "marked-distance" and graphs.test_size == 7
    molecules = legacy_spec("graph", "qm9", {"seed": 1, "target": "homo", "test_size": 0})
    assert molecules.kind == "qm9" and molecules.target == "homo"
    audio = legacy_spec("audio", "wavs", {"class_names": "low,high", "sample_rate": 8000})
    assert (audio.kind, audio.source, audio.labels) == ("spoken-words", "wavs", ["low", "high"])
    assert audio.sample_rate == 8000
    assert legacy_spec("no-such-recipe", None, {}) is None


def test_the_lm_split_is_the_tail_of_the_token_stream_and_at_least_one_block():
    import torch

    spec = spec_class("text")(source="python-docs", val_fraction=0.1)
    ids = torch.arange(1000)
    train, val = spec.split(ids, block_size=16)
    assert torch.equal(torch.cat([train, val]), ids) and len(val) == 100
    assert len(spec.split(torch.arange(50), block_size=16)[1]) == 17
    with pytest.raises(DataError, match="val_fraction"):
        spec_class("text")(val_fraction=1.5)
