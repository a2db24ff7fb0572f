"""Heads' jobs on trained vqa runs: every head ablated in turn, the exact match lost per question template, per seed.

The lecture (transcript): "each attention layer can be attending to different things. One can learn to attend to
shapes and one can learn to attend to textures, for example." For each run given (``tokennet train vqa --seed N``,
the defaults), :func:`tokennet.tasks.heads.head_jobs` — what ``tokennet heads RUN`` prints — with each ablation
(``zero``: the head's output set to 0; ``mean``: set to its mean over the evaluated questions), on the first
``--limit`` held-out test questions (default: all of them). A head is *necessary* for a template when its ablation
costs more than 5 points there.

Heads are interchangeable within a layer across seeds (head 2 of one seed is no relative of head 2 of another),
so the summary counts, per template and ablation, on how many seeds **some head** is necessary for it, and per
layer and template on how many seeds some head *of that layer* is; the head names per seed are in ``per_seed``.
Two tests of "different jobs" per seed: the issue's (two heads whose ablation costs ≥ 10 points on different
templates) and a double dissociation (head a costs ≥ 10 points on template t and < 5 on u, head b the reverse).

``--gpt RUN`` also measures a language model's heads (``tokennet heads``: loss by character class).

    OMP_NUM_THREADS=1 python bench/vqa_heads.py --runs /work/runs/vqa-s0 /work/runs/vqa-s1 /work/runs/vqa-s2
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py
import _record  # noqa: E402

RESULTS = _record.ROOT / "bench" / "results" / "vqa_heads.json"
ABLATIONS = ("zero", "mean")
STRONG = 10.0  # the bar: a head whose ablation costs at least this many points


def measure(run_dir: str, ablations, limit: int | None, layer: int | None = None) -> dict:
    """One run: its seed, its unablated exact match per template, and :func:`head_jobs` per ablation."""
    from tokennet.run import load
    from tokennet.tasks.heads import head_jobs

    run = load(run_dir)
    shape = {key: getattr(run.model.config, key, None) for key in ("dim", "num_layers", "num_heads")}
    out = {"run": str(run_dir), "recipe": run.recipe, "seed": run.settings.get("seed"), "family": run.family,
           "steps": (run.metrics or {}).get("step"), "model": shape, "ablations": {}}
    for ablation in ablations:
        start = time.perf_counter()
        jobs = head_jobs(run, ablation=ablation, limit=limit, layer=layer).to_dict()
        jobs["seconds"] = round(time.perf_counter() - start, 1)
        out["ablations"][ablation] = jobs
    return out


def different_jobs(jobs: dict) -> dict:
    """The two tests of different jobs on one run's measurements (templates only, not ``all``)."""
    templates = [group for group in jobs["groups"] if group != "all"]
    strong = [(job, group) for job in jobs["heads"] for group in templates if job["cost"][group] >= STRONG]
    pairs, dissociations = [], []
    for (first, one), (second, other) in itertools.combinations(strong, 2):
        if first is second or one == other:
            continue
        pair = (f"L{first['layer']}H{first['head']}:{one}", f"L{second['layer']}H{second['head']}:{other}")
        pairs.append(pair)
        if first["cost"][other] < jobs["threshold"] and second["cost"][one] < jobs["threshold"]:
            dissociations.append(pair)
    return {"two_heads_10_points_on_different_templates": bool(pairs), "pairs": pairs,
            "double_dissociation": bool(dissociations), "dissociations": dissociations}


def summarize(per_seed: list[dict]) -> dict:
    """Per ablation: per template, on how many seeds some head is necessary (and some head of each layer); per
    seed, the necessary heads and the tests of different jobs."""
    out = {}
    for ablation in ABLATIONS:
        measured = [run["ablations"][ablation] for run in per_seed if ablation in run["ablations"]]
        if not measured:
            continue
        templates = [group for group in measured[0]["groups"] if group != "all"]
        layers = sorted({job["layer"] for jobs in measured for job in jobs["heads"]})
        some_head = {t: sum(bool(jobs["necessary"][t]) for jobs in measured) for t in templates}
        by_layer = {t: {layer: sum(any(name.startswith(f"L{layer}H") for name in jobs["necessary"][t])
                                   for jobs in measured) for layer in layers} for t in templates}
        out[ablation] = {"seeds": len(measured), "threshold": measured[0]["threshold"],
                         "some_head_necessary": some_head, "some_head_of_layer_necessary": by_layer,
                         "necessary_per_seed": [jobs["necessary"] for jobs in measured],
                         "different_jobs_per_seed": [different_jobs(jobs) for jobs in measured]}
    return out


def print_tables(per_seed: list[dict], summary: dict) -> None:
    from tokennet.tasks.heads import HeadJob, HeadJobs
    from tokennet.tasks.heads_command import format_head_jobs

    for run in per_seed:
        for ablation, jobs in run["ablations"].items():
            print(f"\n== {run['run']} (seed {run['seed']}), ablation {ablation}, {jobs['seconds']} s")
            heads = [HeadJob(**job) for job in jobs["heads"]]
            fields = {k: v for k, v in jobs.items() if k not in ("heads", "necessary", "seconds", "typical_error")}
            print(format_head_jobs(HeadJobs(**fields, heads=heads)))
    for ablation, found in summary.items():
        print(f"\n{ablation}: seeds (of {found['seeds']}) where some head is necessary (> {found['threshold']:g} "
              f"points): {found['some_head_necessary']}")
        tests = found["different_jobs_per_seed"]
        print(f"  two heads ≥ {STRONG:g} points on different templates: "
              f"{[test['two_heads_10_points_on_different_templates'] for test in tests]}; double dissociation: "
              f"{[test['double_dissociation'] for test in tests]}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="trained vqa run directories (one per seed)")
    ap.add_argument("--limit", type=int, default=None, help="held-out questions per run (default: all)")
    ap.add_argument("--ablations", nargs="+", choices=ABLATIONS, default=list(ABLATIONS))
    ap.add_argument("--gpt", default=None, help="also a language-model run (e.g. a gpt-char run)")
    ap.add_argument("--gpt-limit", type=int, default=64, help="the language model's held-out windows")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--note", default=None, help="how the runs were trained, recorded with the settings")
    ap.add_argument("--saved-model", action="store_true",
                    help="also measure a run whose transformer is trained and saved but whose process did not finish "
                    "(no metrics.json: e.g. stopped while training the CNN baselines); listed under 'unfinished'")
    args = ap.parse_args(argv)
    limit = args.limit if args.limit is not None else 10**9
    finished = [run for run in args.runs if (Path(run) / "metrics.json").is_file()
                or (args.saved_model and (Path(run) / "model.safetensors").is_file())]
    skipped = [run for run in args.runs if run not in finished]
    unfinished = [run for run in finished if not (Path(run) / "metrics.json").is_file()]
    for run in skipped:
        print(f"skipped {run}: no metrics.json (not a finished run)", flush=True)
    per_seed = [measure(run, args.ablations, limit) for run in finished]
    summary = summarize(per_seed)
    results = {"per_seed": per_seed, "skipped": skipped, "unfinished": unfinished, "summary": summary}
    if args.gpt:
        results["gpt"] = measure(args.gpt, args.ablations, args.gpt_limit)
        print_tables([results["gpt"]], {})
    print_tables(per_seed, summary)
    return _record.write(args.out, results, argv=argv,
                         settings={"runs": args.runs, "limit": args.limit, "ablations": args.ablations,
                                   "gpt": args.gpt, "gpt_limit": args.gpt_limit, "strong_points": STRONG,
                                   "note": args.note},
                         torch_threads=os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    main()
