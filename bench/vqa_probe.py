"""The impala and the gazelle on trained vqa runs: a linear probe of each animal patch's species per depth, as trained
and with the patch's look-alikes cut — what ``tokennet probe RUN`` prints — beside each run's patch size, accuracy
and grouping ratio.

The lecture (transcript): "I'm not sure if I'm an impala or I'm a gazelle or what I am. So I will attend to other
things that look like me in the image. And then I will update my own representation by aggregating information from
the other things that are similar." :func:`tokennet.tasks.vqa_probe.species_probe` on ``--pictures`` new pictures
per run (70 % fit the probe, 30 % score it). ``gain``: the probe after the first block minus at the input;
``own_cut_loss`` / ``alike_cut_loss``: how much of the probe after each block the cut takes away (points); with
``standard_error`` of one accuracy on the scored patches (√(p(1−p)/n), at the input's p).

    OMP_NUM_THREADS=1 python bench/vqa_probe.py --runs /work/runs/vqa/seed0 /work/runs/vqa-p8
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py
import _record  # noqa: E402

RESULTS = _record.ROOT / "bench" / "results" / "vqa_probe.json"
RUN_METRICS = ("exact_match", "exact_match_same_species", "exact_match_species", "patch_grouping_ratio",
               "head_grouping_max")


def measure(run_dir: str, pictures: int) -> dict:
    """One run: its settings and metrics that bear on the probe, and the probe per cut and depth."""
    from tokennet.run import load
    from tokennet.tasks.vqa_probe import probe_run

    run = load(run_dir)
    config = run.model.config
    probe = probe_run(run, pictures=pictures)
    accuracy = probe["none"][0] / 100
    probe["standard_error"] = round(100 * math.sqrt(accuracy * (1 - accuracy) / probe["test_patches"]), 2)
    probe["gain"] = round(probe["none"][1] - probe["none"][0], 2)
    for cut in ("own", "alike"):
        probe[f"{cut}_cut_loss"] = [round(seen - cut_off, 2) for seen, cut_off in zip(probe["none"], probe[cut])][1:]
    metrics = run.metrics or {}
    return {"run": str(run_dir), "seed": run.settings.get("seed"), "patch_size": config.patch_size,
            "modality_mask": config.modality_mask, "metrics": {key: metrics.get(key) for key in RUN_METRICS},
            "probe": probe}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="trained vqa run directories")
    ap.add_argument("--pictures", type=int, default=400, help="pictures per run (default 400)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--note", default=None, help="how the runs were trained, recorded with the settings")
    args = ap.parse_args(argv)
    per_run = [measure(run, args.pictures) for run in args.runs]
    print("| run | patch | exact match | depth: input / blocks … | own cut − | alike cut − | s.e. |")
    print("|---|---|---|---|---|---|---|")
    for row in per_run:
        probe = row["probe"]
        print(f"| {row['run']} | {row['patch_size']} | {row['metrics']['exact_match']} | "
              f"{' / '.join(f'{value:.1f}' for value in probe['none'])} | {probe['own_cut_loss']} | "
              f"{probe['alike_cut_loss']} | {probe['standard_error']} |")
    return _record.write(args.out, {"per_run": per_run}, argv=argv, script=Path(__file__).name,
                         settings={"runs": args.runs, "pictures": args.pictures, "note": args.note},
                         torch_threads=os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    main()
