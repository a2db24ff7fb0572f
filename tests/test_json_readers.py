"""Every JSON file tokennet reads goes through ``tokennet.jsonio`` (issue 44): a document nested past
``MAX_JSON_DEPTH`` — here 300 levels, which Python's json would parse — is refused with one line naming the file,
or skipped where the reader skips damaged records, instead of being read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tokennet.errors import TokennetError
from tokennet.jsonio import MAX_JSON_DEPTH

DEPTH = 300
DEEP = "[" * DEPTH + "]" * DEPTH
GRAPH_RUN = Path(__file__).parent / "fixtures" / "runs_0_1" / "graph"


def test_the_depth_is_past_the_bound_but_parses_in_plain_json():
    assert DEPTH > MAX_JSON_DEPTH and json.loads(DEEP)


def _one_line(call, *names: str) -> str:
    with pytest.raises(TokennetError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and re.search(r"nested \d+ levels deep", msg) and all(n in msg for n in names), msg
    return msg


@pytest.mark.parametrize("name", ["run.json", "metrics.json", "config.json"])
def test_run_files(tmp_path, name):
    import tokennet
    from tokennet.models.registry import read_config
    from tokennet.run import read_metrics, read_run_info

    d = tmp_path / "run"
    shutil.copytree(GRAPH_RUN, d)
    (d / name).write_text(json.dumps({"settings": json.loads(DEEP), "family": "graph"}))
    read = {"run.json": read_run_info, "metrics.json": read_metrics, "config.json": read_config}[name]
    _one_line(lambda: read(d), str(d / name))
    _one_line(lambda: tokennet.load(d), str(d / name))


def test_checkpoint_trainer_json(tmp_path):
    import torch

    from tokennet.train.checkpoint import read_checkpoint, save_checkpoint

    step = save_checkpoint(tmp_path / "ck", 1, {"w": torch.zeros(2)}, {"state": {}, "param_groups": []}, {}, [])
    (step / "trainer.json").write_text(json.dumps({"step": 1, "optimizer": {}, "rng": json.loads(DEEP)}))
    _one_line(lambda: read_checkpoint(step), str(step))


def test_lora_header(tmp_path):
    import torch
    from safetensors.torch import save_file

    from tokennet.layers.lora import ADAPTER_FORMAT, load_adapter

    f = tmp_path / "adapter.safetensors"
    save_file({"x": torch.zeros(1)}, str(f), metadata={"format": ADAPTER_FORMAT, "lora": DEEP})
    _one_line(lambda: load_adapter(torch.nn.Linear(2, 2), f), str(f))


def test_chat_jsonl(tmp_path):
    from tokennet.data.chats import is_chat_file, read_chats
    from tokennet.tokens.text import train_tokenizer

    f = tmp_path / "chats.jsonl"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}]
    f.write_text(json.dumps({"messages": chat}) + "\n"
                 + json.dumps({"messages": json.loads(DEEP)}) + "\n")
    _one_line(lambda: read_chats(f, train_tokenizer("char", "hi user assistant")), f"{f}:2")
    f.write_text(json.dumps({"messages": json.loads(DEEP)}) + "\n")
    assert is_chat_file(str(f))  # a malformed chat file still is one: read_chats names the line


@pytest.mark.parametrize("module, load", [("spoken_digits", "load_spoken_digits"),
                                          ("other_speech", "load_other_digits")])
def test_digit_caches(tmp_path, module, load):
    import importlib

    f = tmp_path / "cache.npz"
    np.savez(f, clips=np.zeros((1, 4), np.int16), digit=np.zeros(1, np.int64), voice=np.zeros(1, np.int64),
             test=np.zeros(1, bool), voices=np.array(["v"]), params=np.array(DEEP))
    _one_line(lambda: getattr(importlib.import_module(f"tokennet.data.{module}"), load)(f), str(f))


def test_report_log_skips_a_deep_line(tmp_path):
    from tokennet.viz.report.logs import read_log

    f = tmp_path / "log.jsonl"
    f.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n" + json.dumps({"step": 2, "loss": json.loads(DEEP)}) + "\n")
    data = read_log(f)
    assert [r["step"] for r in data.train] == [1] and data.skipped == [2]


def test_report_vqa_sweep(tmp_path):
    from types import SimpleNamespace

    from tokennet.viz.report.vqa import SWEEP, _receptive_field

    (tmp_path / SWEEP).write_text(json.dumps({"rows": [], "settings": json.loads(DEEP)}))
    assert "cannot read it as a sweep" in _receptive_field(SimpleNamespace(path=tmp_path))


def test_bench_claim_result(tmp_path):
    from tokennet.demos.claims.architectures import read_bench_claim

    (tmp_path / "r.json").write_text(json.dumps({"claim": {"holds": None, "measured": "x", "run": json.loads(DEEP)}}))
    result = read_bench_claim("r.json", "x.py", results_dir=tmp_path)
    assert result.holds is None and "JSONTooDeep" in result.run, result
