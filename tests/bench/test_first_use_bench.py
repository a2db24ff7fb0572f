"""bench/first_use.py without the big model: the medians of nested rows, the rows it runs, and the speculative row's
identical-text check on fakes."""

import time
from types import SimpleNamespace

from support import load_bench

B = load_bench("first_use")


def test_medians_follow_every_number_by_its_path():
    rounds = [{"second_process": {"first_s": 3.0, "tokens_per_s": {"tokennet": 100.0, "llama_cpp": 90.0}},
               "speculative_cli": {"speedup": 1.5, "same_text": True}},
              {"second_process": {"first_s": 5.0, "tokens_per_s": {"tokennet": 120.0, "llama_cpp": 80.0}},
               "speculative_cli": {"speedup": 1.1, "same_text": False}},
              {"second_process": {"first_s": 4.0, "tokens_per_s": {"tokennet": 110.0, "llama_cpp": 70.0}},
               "speculative_cli": {"speedup": 1.3, "same_text": True}}]
    got = B._medians(rounds)
    assert got == {"second_process.first_s": 4.0, "second_process.tokens_per_s.tokennet": 110.0,
                   "second_process.tokens_per_s.llama_cpp": 80.0, "speculative_cli.speedup": 1.3}  # no booleans


def test_only_the_rows_asked_for_run(monkeypatch):
    called = []
    for name in ("train_to_sample", "generate_rows", "serve_first_request", "second_process", "serve_window",
                 "speculative_cli"):
        monkeypatch.setattr(B, name, lambda *a, _n=name: called.append((_n, a)) or {"x": 1.0})
    args = SimpleNamespace(rows=["speculative-cli", "serve-window"], run="r", gguf=None, no_prebuilt=False, steps=1,
                           streams=[1, 4], window=5.0)
    row = B._round(args)
    assert [c[0] for c in called] == ["serve_window"] * 4 + ["speculative_cli"]
    assert set(row["serve_window"]) == {"compile 1", "no-compile 1", "compile 4", "no-compile 4"}


def test_the_speculative_row_compares_the_texts(monkeypatch):
    outputs = iter(["text A", "text B"])

    def run(*a, **k):
        time.sleep(0.01)
        return SimpleNamespace(stdout=next(outputs))

    monkeypatch.setattr(B.subprocess, "run", run)
    assert B.speculative_cli("run")["same_text"] is False
