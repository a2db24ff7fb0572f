"""A short soak of ``tokennet serve`` with bench/serve_soak.py's own code: 4 streams for 25 s of mixed requests
(greedy, sampled, structured output, tools, embeddings) with bad requests and disconnects mixed in, against two
server processes (a random gpt-mini and a random text encoder). RSS growth is judged by the 10-minute bench only:
25 s holds no warm-up worth the name."""


import pytest
from support import load_bench

for name in ("uvicorn", "llguidance", "jsonschema", "tokenizers", "jinja2"):
    pytest.importorskip(name)


def _bench():
    return load_bench("serve_soak")


B = _bench()


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    d = tmp_path_factory.mktemp("soak")
    return B.run_soak(B.make_lm_run(d / "lm"), B.make_encoder_run(d / "encoder"), streams=4, seconds=25,
                      warmup_s=5, sample_s=1, no_compile=True)


def test_every_good_request_is_answered_and_every_answer_is_right(soak):
    for kind, r in soak["good"].items():
        assert r["sent"] > 0, kind
        assert (r["lost"], r["wrong"]) == (0, 0), (kind, r, soak["examples"][:5])
    assert soak["good"]["greedy"]["outcomes"].get("stream") and soak["good"]["greedy"]["outcomes"].get("whole")
    assert soak["good"]["structured"]["outcomes"].get("valid") and soak["good"]["tools"]["outcomes"].get("call")


def test_every_probe_was_sent_and_each_cut_stream_had_begun(soak):
    assert all(r["sent"] > 0 for r in soak["probes"].values()), soak["probes"]
    assert set(soak["probes"]["cut_stream"]["outcomes"]) == {"closed after the first event"}, soak["probes"]


@pytest.mark.parametrize("name", B.BAD)  # nested_10000 among them: a 400 since issue 44 (was a RecursionError 500)
def test_a_bad_request_gets_a_4xx(soak, name):
    outcomes = soak["probes"][name]["outcomes"]
    assert outcomes and all(k.startswith("4") for k in outcomes), outcomes


def test_the_server_logs_no_internal_error(soak):  # partial_body's hang-up too (issue 44: it was a traceback)
    for name, s in soak["servers"].items():
        assert (s["tracebacks"], s["internal_error_lines"]) == (0, 0), (name, s["exceptions"])


def test_the_prefix_cache_filled_up_to_its_bound_and_never_past_it(soak):
    cache = [s for s in soak["samples"] if s.get("cache_budget_bytes") is not None]
    assert len(cache) >= 10 and soak["verdicts"]["prefix_cache_within_bound"]
    assert max(s["cache_bytes"] for s in cache) > cache[0]["cache_budget_bytes"] // 2  # it evicted: the bound bit


def test_no_row_is_held_after_the_load_and_both_servers_exit_0(soak):
    assert soak["verdicts"]["no_row_held_at_end"], soak["after"]
    assert soak["verdicts"]["servers_exit_0"], soak["servers"]
    assert all(s["rss_kb_lm"] and s["rss_kb_enc"] for s in soak["samples"])  # RSS was read from /proc
