"""Write shakespeare_mc.jsonl: multiple-choice line completions over the held-out end of Tiny Shakespeare.

Each question is a line of the play text cut after a few words; the choices are its true ending and three
endings of other lines (with as many words, so length alone does not tell), shuffled. The lines come from
the last 10% of the corpus — the validation split of ``tokennet train gpt-char`` (default data: the
embedded Tiny Shakespeare), so a run trained there has not seen them.

    python bench/lm_eval/make_shakespeare_mc.py [--n 200] [--seed 0] [--out bench/lm_eval/shakespeare_mc.jsonl]

The task that reads it: ``bench/lm_eval/shakespeare_mc.yaml`` (``lm-eval ... --include_path bench/lm_eval``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokennet.data.text import shakespeare


def questions(n: int = 200, seed: int = 0) -> list[dict]:
    """``n`` questions ``{"context", "choices", "label"}`` (the context ends before a space; choices have none)."""
    text = shakespeare()
    held = text[int(len(text) * 0.9):]
    lines = [ln.strip() for ln in held.splitlines()]
    lines = [ln for ln in lines if len(ln.split()) >= 6 and not ln.endswith(":")]  # verse, not speaker names
    rng = random.Random(seed)
    by_len: dict[int, list[str]] = {}
    cut = {}
    for ln in lines:
        words = ln.split()
        k = len(words) // 2
        cut[ln] = (" ".join(words[:k]), " ".join(words[k:]))
        by_len.setdefault(len(words) - k, []).append(cut[ln][1])
    pool = [ln for ln in dict.fromkeys(lines) if len(set(by_len[len(ln.split()) - len(ln.split()) // 2])) >= 4]
    out = []
    for ln in rng.sample(pool, n):
        ctx, end = cut[ln]
        others = sorted(set(by_len[len(end.split())]) - {end})
        choices = [end, *rng.sample(others, 3)]
        rng.shuffle(choices)
        out.append({"context": ctx, "choices": choices, "label": choices.index(end)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).with_name("shakespeare_mc.jsonl")))
    a = ap.parse_args()
    qs = questions(a.n, a.seed)
    Path(a.out).write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in qs), encoding="utf-8")
    print(f"{a.out}: {len(qs)} questions")


if __name__ == "__main__":
    main()
