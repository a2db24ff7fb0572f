"""bench/gemma_memory.py's pure parts, with fakes: a server's peaks as ratios to the file above the baseline, the
summary's lines for each part, and what ``--before`` keeps (no model, no server, no subprocess)."""


from support import load_bench

MB = 1_000_000


def _script():
    return load_bench("gemma_memory")


def _served(server="tokennet", mode="int4", peak=900 * MB):
    return {"server": server, "mode": mode, "peak_when_ready_bytes": 700 * MB, "peak_after_single_bytes": 800 * MB,
            "peak_rss_bytes": peak}


def test_server_peaks_are_ratios_to_the_file_above_the_baseline():
    row = _script().with_ratios(_served(), baseline=200 * MB, size=100 * MB)
    assert row["baseline_rss_bytes"] == 200 * MB and row["peak_above_baseline_bytes"] == 700 * MB
    assert row["peak_over_file"] == 7.0 and row["ready_peak_over_file"] == 5.0
    assert row["single_peak_over_file"] == 6.0 and row["absolute_peak_over_file"] == 9.0
    assert row["mode"] == "int4"  # the measured fields are kept


def test_summary_has_a_line_per_part_and_per_server():
    script = _script()
    rows = [script.with_ratios(_served(mode=mode), 200 * MB, 100 * MB) for mode in script.MODES]
    rows.append(script.with_ratios(_served("llama.cpp", "Q4_K_M", peak=250 * MB), 50 * MB, 100 * MB))
    rec = {"gguf": "g.gguf", "file_bytes": 100 * 2**20,
           "import_memory": {"peak_above_baseline_over_file": 1.39},
           "decode": [{"mode": "int4", "peak_over_file": 2.84, "ids": [1, 2]}],
           "serve": {"baselines": script.BASELINES, "rows": rows}}
    lines = script.summary(rec, None)
    assert lines[0].startswith("g.gguf (100 MiB)") and lines[1] == "import: 1.39×" and lines[2] == "decode int4: 2.84×"
    assert lines[3].startswith("serve tokennet int4: 7.00× (ready 5.00×, after one request 6.00×")
    assert lines[5].startswith("serve llama.cpp Q4_K_M: 2.00×") and "`import llama_cpp`" in lines[5]
    assert len(lines) == 6


def test_summary_of_some_parts_and_a_skipped_llamacpp():
    script = _script()
    rec = {"gguf": "g.gguf", "file_bytes": 2**20,
           "serve": {"baselines": script.BASELINES, "rows": [], "llamacpp_skipped": "not installed: fastapi"}}
    assert script.summary(rec, {"decode": []})[1:] == ["serve llama.cpp: skipped (not installed: fastapi)"]


def test_before_is_kept_with_the_share_of_same_greedy_tokens():
    script = _script()
    rec = {"gguf": "g.gguf", "file_bytes": 2**20,
           "decode": [{"mode": "int4", "ids": [5, 6, 7, 8], "peak_over_file": 2.5}]}
    before = {"commit": "abc", "import_memory": {"peak_above_baseline_over_file": 1.5},
              "decode": [{"mode": "int4", "ids": [5, 6, 0, 8], "peak_over_file": 3.0}]}
    script.keep_before(rec, before)
    assert rec["before"]["commit"] == "abc" and rec["before"]["serve"] is None
    assert rec["decode"][0]["same_greedy_tokens_as_before"] == 0.75
    assert script.summary(rec, before)[1:] == [
        "decode int4: 2.50× (before 3.00×; the first 4 greedy tokens differ)"]
