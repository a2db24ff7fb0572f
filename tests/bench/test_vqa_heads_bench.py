"""bench/vqa_heads.py: per seed, the heads necessary for each template; the summary counts seeds, not head numbers
(which mean nothing across seeds); the two tests of different jobs hold only where they should."""

from support import load_bench


def _jobs(costs: dict[str, dict[str, float]]) -> dict:
    """A run's measurements as head_jobs' dict: ``costs`` is ``{"L0H1": {template: points lost}}``."""
    groups = ["count", "colour", "all"]
    costs = {**{name: {} for name in ("L0H0", "L0H1", "L1H0", "L1H1")}, **costs}
    heads = [{"layer": int(name[1]), "head": int(name[3]), "cost": {**{g: 0.0 for g in groups}, **cost}}
             for name, cost in costs.items()]
    necessary = {g: [name for name, cost in costs.items() if cost.get(g, 0.0) > 5.0] for g in groups}
    return {"groups": groups, "heads": heads, "threshold": 5.0, "necessary": necessary}


def test_different_jobs_needs_two_heads_on_two_templates_and_a_dissociation_needs_each_spared():
    bench = load_bench("vqa_heads")
    apart = bench.different_jobs(_jobs({"L0H0": {"count": 30.0}, "L1H1": {"colour": 12.0}}))
    assert apart["two_heads_10_points_on_different_templates"] and apart["double_dissociation"]
    assert apart["dissociations"] == [("L0H0:count", "L1H1:colour")]
    shared = bench.different_jobs(_jobs({"L0H0": {"count": 30.0, "colour": 20.0}, "L1H1": {"colour": 12.0}}))
    assert shared["two_heads_10_points_on_different_templates"] and not shared["double_dissociation"]
    one_head = bench.different_jobs(_jobs({"L0H0": {"count": 30.0, "colour": 20.0}}))
    assert not one_head["two_heads_10_points_on_different_templates"]


def test_the_summary_counts_seeds_per_template_and_per_layer():
    bench = load_bench("vqa_heads")
    per_seed = [{"ablations": {"zero": _jobs(costs)}} for costs in
                ({"L0H0": {"count": 30.0}}, {"L1H1": {"count": 8.0}}, {"L0H1": {"colour": 6.0}})]
    found = bench.summarize(per_seed)["zero"]
    assert found["seeds"] == 3 and found["some_head_necessary"] == {"count": 2, "colour": 1}
    assert found["some_head_of_layer_necessary"] == {"count": {0: 1, 1: 1}, "colour": {0: 1, 1: 0}}
    assert "mean" not in bench.summarize(per_seed)


def test_main_measures_the_finished_runs_skips_the_others_and_records_them(tmp_path, one_thread):
    import json

    from tokennet.recipes import train

    sets = {"dim": 16, "num_layers": 1, "num_heads": 2, "batch_size": 8, "max_iters": 2, "eval_interval": 0,
            "warmup_iters": 1, "test_size": 12, "unseen_size": 2, "val_size": 4, "progress": False,
            "baselines": False, "grouping": False, "report": False}
    run, _ = train("vqa", out=tmp_path / "vqa", sets=sets, device="cpu")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    out = tmp_path / "heads.json"
    bench = load_bench("vqa_heads")
    bench.main(["--runs", str(run), str(unfinished), "--ablations", "zero", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["skipped"] == [str(unfinished)] and len(record["per_seed"]) == 1
    measured = record["per_seed"][0]
    assert measured["recipe"] == "vqa" and measured["model"]["num_heads"] == 2
    jobs = measured["ablations"]["zero"]
    assert jobs["examples"] == 12 and [job["head"] for job in jobs["heads"]] == [0, 1]
    assert record["summary"]["zero"]["seeds"] == 1 and "command" in record and "commit" in record
