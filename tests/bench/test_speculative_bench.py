"""bench/speculative.py without the big model: its tables, ratios, goals and identical-output checks on fakes.

The decoders, the llama.cpp worker and the servers are replaced by fakes that return chosen tokens and timings, so
each check can be made to fail: a speculative mode whose tokens differ from its own system's plain ones is not
``identical``, a ratio under its goal is not met, a draft's kept tokens are counted from the ids that follow it.
"""

from types import SimpleNamespace

import numpy as np
from support import load_bench


def _bench():
    return load_bench("speculative")


B = _bench()


def run_of(tokens, seconds, **extra):
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
            "acceptance_rate": extra.pop("acceptance_rate", 0.0), **extra}


def test_timed_rounds_warms_every_mode_then_rotates_the_order():
    calls = []
    decoders = {mode: (lambda mode=mode: calls.append(mode) or run_of([1], 1.0)) for mode in ("a", "b", "c")}
    rounds = B.timed_rounds(decoders, 3)
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {mode: len(runs) for mode, runs in rounds.items()} == {"a": 3, "b": 3, "c": 3}


def test_summarize_compares_each_mode_with_its_own_systems_plain_decoding():
    plain, theirs = [5, 6, 7, 8], [5, 6, 9, 9]
    rounds = {"plain": [run_of(plain, 2.0), run_of(plain, 2.0)],
              "ngram": [run_of(plain, 1.0, acceptance_rate=0.5), run_of([5, 6, 7, 0], 1.0)],  # round 2 drifts
              "llama.cpp plain": [run_of(theirs, 4.0, acceptance_rate=None)],
              "llama.cpp lookup": [run_of(theirs, 2.0, acceptance_rate=0.75)]}
    modes = B.summarize(rounds)
    assert modes["ngram"]["identical"] is False and modes["ngram"]["common_prefix_with_plain"] == 3
    assert modes["ngram"]["speedup"] == 2.0 and modes["ngram"]["system"] == "tokennet"
    # llama.cpp's lookup is checked against llama.cpp's plain tokens, not tokennet's (which differ from position 2)
    lookup = modes["llama.cpp lookup"]
    assert lookup["identical"] is True and lookup["speedup"] == 2.0 and lookup["system"] == "llama.cpp"
    assert all("tokens" not in r for r in lookup["rounds"])
    assert B.agreement(rounds) == {"tokennet_tokens": 4, "llama_cpp_tokens": 4, "common_prefix": 2, "identical": False}
    assert B.agreement({"plain": rounds["plain"]}) is None


def results_with(rewrite: dict, chat: dict) -> dict:
    """Workload results whose modes have the given tokens/s."""
    def modes(speeds):
        return {mode: {"tokens": 8, "tokens_per_s": tps, "speedup": 1.0, "identical": True,
                       "acceptance_rate": None if mode == "llama.cpp plain" else 0.5}
                for mode, tps in speeds.items()}
    return {"rewrite": {"modes": modes(rewrite)}, "chat": {"modes": modes(chat)}}


def test_ratios_hold_the_goals_of_issue_47_and_can_miss_them():
    results = results_with({"plain": 10.0, "ngram": 25.0, "llama.cpp plain": 12.0, "llama.cpp lookup": 20.0},
                           {"plain": 10.0, "ngram": 9.0, "llama.cpp plain": 12.0, "llama.cpp lookup": 11.0})
    summary = B.ratios(results)
    rewrite, chat = summary["rewrite"], summary["chat"]
    assert rewrite["ngram_over_plain"] == {"value": 2.5, "goal": 2.0, "met": True}
    assert rewrite["ngram_over_llama_cpp_lookup"] == {"value": 1.25, "goal": 1.2, "met": True}
    assert chat["ngram_over_plain"] == {"value": 0.9, "goal": 1.0, "met": False}
    assert chat["ngram_over_llama_cpp_lookup"]["goal"] is None and chat["ngram_over_llama_cpp_lookup"]["met"] is None
    text = B.table(results, summary)
    assert "rewrite   ngram over plain: 2.50x (goal >= 2.0: met)" in text
    assert "chat      ngram over plain: 0.90x (goal >= 1.0: NOT met)" in text
    assert "llama.cpp lookup" in text and "identical" in text.splitlines()[0]
    # without llama.cpp the comparison is absent, not a failure
    alone = B.ratios(results_with({"plain": 10.0, "ngram": 15.0}, {"plain": 10.0, "ngram": 10.0}))
    assert alone["rewrite"]["ngram_over_llama_cpp_lookup"] == {"value": None, "goal": 1.2, "met": None}
    assert alone["rewrite"]["ngram_over_plain"]["met"] is False


class FixedDraft:
    """A draft model proposing the given drafts in turn."""

    def __init__(self, drafts):
        self.drafts = list(drafts)

    def __call__(self, input_ids, /, **kwargs):
        return np.array(self.drafts.pop(0), dtype=np.intc)


def test_counting_draft_counts_the_tokens_the_next_call_kept():
    counter = B.CountingDraft(FixedDraft([[7, 8, 9], [], [4, 5]]))
    prompt = [1, 2, 3]
    counter(np.array(prompt + [6]))  # first draft 7 8 9 after 6
    counter(np.array(prompt + [6, 7, 8, 0]))  # 7 8 kept, then the target chose 0 instead of 9
    assert (counter.drafted, counter.accepted, counter.verifications) == (3, 2, 1)
    counter(np.array(prompt + [6, 7, 8, 0, 1]))  # an empty draft is not a verification
    assert (counter.drafted, counter.accepted, counter.verifications) == (3, 2, 1)
    assert counter.acceptance_rate == 2 / 3
    counter.reset()
    assert (counter.drafted, counter.accepted, counter.acceptance_rate) == (0, 0, 0.0)


class FakeTokenizer:
    stop_ids = [0]

    def encode(self, text):
        return [ord(c) % 50 + 1 for c in text]

    def decode(self, ids):
        return " ".join(map(str, ids))


class FakeLlama:
    """The llama.cpp worker: its own rendering of the template, and decodings that match or drift."""

    def __init__(self, own_ids, lookup_tokens):
        self.own_ids, self.lookup_tokens, self.asked = own_ids, lookup_tokens, []

    def ask(self, **request):
        self.asked.append(request)
        if request["op"] == "template":
            return {"ids": self.own_ids}
        tokens = self.lookup_tokens if request["mode"] == "llama.cpp lookup" else [3, 4, 5]
        return run_of(tokens, 1.0, acceptance_rate=None)


def test_bench_workload_feeds_both_systems_the_same_prompt_and_checks_each(monkeypatch):
    prompt = "<user>hi</user>"
    monkeypatch.setattr(B, "render_chat", lambda tokenizer, messages, where: prompt)
    monkeypatch.setattr(B, "decode", lambda mode, run, ids, args, draft_run: run_of([3, 4, 6], 1.0))
    run = SimpleNamespace(tokenizer=FakeTokenizer(), path="fake")
    args = SimpleNamespace(rounds=2, new_tokens=3)
    ids = FakeTokenizer().encode(prompt)
    llama = FakeLlama(own_ids=ids, lookup_tokens=[3, 4, 9])
    out = B.bench_workload("chat", run, None, ["plain", "ngram", "llama.cpp plain", "llama.cpp lookup"], args, llama)
    decodes = [r for r in llama.asked if r["op"] == "decode"]
    assert all(r["ids"] == ids and r["stop"] == [0] and r["new_tokens"] == 3 for r in decodes)
    assert len(decodes) == 2 * 3  # two modes: once unrecorded, then two rounds
    assert out["llama_cpp_prompt"]["own_template_same_ids"] is True and out["prompt_tokens"] == len(ids)
    assert out["modes"]["ngram"]["identical"] is True
    assert out["modes"]["llama.cpp lookup"]["identical"] is False  # 9 where llama.cpp plain chose 5
    assert out["agreement"]["common_prefix"] == 2
    other = B.bench_workload("chat", run, None, ["plain", "llama.cpp plain"], args, FakeLlama([1, 2], [3]))
    assert other["llama_cpp_prompt"]["own_template_same_ids"] is False
    assert other["llama_cpp_prompt"]["own_template_prompt_tokens"] == 2


def test_server_summary_medians_speedups_and_the_same_text_check():
    def row(system, mode, tps, text, rate=None, streams=8):
        return {"workload": "rewrite", "streams": streams, "system": system, "speculation": mode, "tokens_per_s": tps,
                "text": text, "acceptance_rate": rate, "prompt_tokens": [151], "failures": 0}

    rows = [row("tokennet", "off", 10.0, "a"), row("tokennet", "off", 12.0, "a"), row("tokennet", "off", 14.0, "a"),
            row("tokennet", "ngram", 30.0, "a", 0.9), row("tokennet", "ngram", 36.0, "a", 0.8),
            row("tokennet", "ngram", 24.0, "a", None),
            row("llama.cpp", "off", 20.0, "a"), row("llama.cpp", "lookup", 10.0, "b")]
    summary = {(x["system"], x["speculation"]): x for x in B.server_summary(rows)}
    ngram = summary[("tokennet", "ngram")]
    assert ngram["tokens_per_s"] == 30.0 and ngram["speedup_over_off"] == 2.5 and ngram["same_text_as_off"] is True
    assert ngram["per_stream_tokens_per_s"] == 30.0 / 8 and abs(ngram["acceptance_rate"] - 0.85) < 1e-12
    lookup = summary[("llama.cpp", "lookup")]
    assert lookup["same_text_as_off"] is False and lookup["speedup_over_off"] == 0.5
    assert lookup["acceptance_rate"] is None
    text = B.server_table(B.server_summary(rows))
    assert "| rewrite | 8 | llama.cpp | lookup | 10.0 | 1.2 | 0.50 | False | - | [151] | 0 |" in text


def test_acceptance_between_health_readings_and_the_request_fields():
    before = {"drafted": 10, "accepted": 5}
    assert B.accepted_between(before, {"drafted": 30, "accepted": 20}) == 0.75
    assert B.accepted_between(before, before) is None and B.accepted_between(None, before) is None
    args = SimpleNamespace(draft_tokens=6, tokennet_speculation=True)
    assert B.request_extra("tokennet", "ngram", args) == {"speculative": "ngram", "draft_tokens": 6}
    assert B.request_extra("llama.cpp", "lookup", args)["repeat_penalty"] == 1.0  # its server's default is 1.1
    assert B.request_extra("tokennet", "ngram", SimpleNamespace(draft_tokens=6, tokennet_speculation=False)) == {}


def test_the_command_line():
    args = B.parse(["--server"])
    assert args.streams == [1, 8] and args.out.endswith("speculative-serve.json") and args.lookup_tokens == 10
    assert B.parse(["--run", "r", "--llama-cpp"]).out.endswith("speculative.json")
