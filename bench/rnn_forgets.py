"""An RNN encoder–decoder without attention forgets long inputs (the lecture; Bahdanau et al. 2015, Fig. 2).

Three encoder–decoders learn the same toy task — *reverse a string of digits* (``3 1 4 1 5`` → ``5 1 4 1 3``)
— on sources of ``--train-lengths LO HI`` digits, with the same steps, batch, optimizer and seed, and are then
tested at every length of ``--test-lengths``, including lengths longer than any seen in training:

- ``gru``: the bidirectional-GRU encoder–decoder **without** attention (``bahdanau`` family,
  ``attention=False``): the decoder reads one fixed vector ``c = [h→_S; h←_1]`` of ``dim`` numbers however
  long the input (Cho et al. 2014);
- ``gru_attention``: the same GRUs **with** Bahdanau's additive attention, ``c_t = Σ_j α_tj h_j``;
- ``transformer``: the encoder–decoder Transformer (``seq2seq`` family, sinusoidal positions).

Reported per architecture and length: exact match (%), chrF (sacrebleu, over the digit string) and the
per-position token accuracy (%), greedy decoding. The claim holds when, from the shortest to the longest
training length, the GRU without attention loses much more exact match than both attention models.

It prints a markdown table and writes ``bench/results/rnn_forgets.json`` (with the ``claim`` object that
``tokennet demo claims`` reads) and ``bench/results/rnn_forgets.png``. Accuracies are seeded and do not
depend on the machine's load; the seconds do.

Usage::

    python bench/rnn_forgets.py                          # the recorded run (defaults below)
    python bench/rnn_forgets.py --steps 250 --dim 32 --lr 5e-3 --train-lengths 1 8 --test-lengths 2 8 12  # ~1 min

The experiment's functions (:func:`make_batch`, :func:`build`, :func:`train`, :func:`evaluate`,
:func:`run_experiment`, :func:`claim`) are what ``tests/bench/test_rnn_forgets.py`` calls.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.decode import greedy_search, strip_special  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402

PAD, BOS, EOS = 0, 1, 2  # tokennet's special ids; digit d is token d + 3
VOCAB = 13
ARCHS = ("gru", "gru_attention", "transformer")
LABELS = {"gru": "GRU (no attention)", "gru_attention": "GRU + attention", "transformer": "Transformer"}


sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, machine  # noqa: E402


def make_batch(lengths: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Random digit strings of the given lengths and their reversals.

    Args:
        lengths: ``(B,)`` source lengths (≥ 1).
        gen: the random generator.

    Returns:
        ``src (B, S)`` right-padded digits, ``tgt_in (B, T)`` = ``<bos> y_1 … y_n`` and ``tgt_out (B, T)`` =
        ``y_1 … y_n <eos>`` (−100 past the end), with ``S = max(lengths)`` and ``T = S + 1``.
    """
    B, S = len(lengths), int(lengths.max())
    digits = torch.randint(3, 3 + 10, (B, S), generator=gen)
    keep = torch.arange(S)[None] < lengths[:, None]  # (B, S)
    src = torch.where(keep, digits, torch.full_like(digits, PAD))
    tgt_out = torch.full((B, S + 1), -100, dtype=torch.long)
    tgt_in = torch.full((B, S + 1), PAD, dtype=torch.long)
    tgt_in[:, 0] = BOS
    for b, n in enumerate(lengths.tolist()):
        rev = src[b, :n].flip(0)
        tgt_out[b, :n], tgt_out[b, n] = rev, EOS
        tgt_in[b, 1 : n + 1] = rev
    return src, tgt_in, tgt_out


def build(arch: str, *, dim: int = 64, max_len: int = 64, layers: int = 2) -> nn.Module:
    """One of :data:`ARCHS`, ``dim`` wide, able to read and write ``max_len`` digits.

    The GRUs have one layer each way (``dim // 2`` per encoder direction, a ``dim``-wide decoder state); the
    Transformer has ``layers`` encoder and decoder blocks, 4 heads, MLP ×2, no dropout.
    """
    common = dict(vocab_size=VOCAB, max_source_len=max_len, max_target_len=max_len + 2, dim=dim, dropout=0.0)
    if arch == "gru":
        return create_model("bahdanau-small", num_layers=1, attention=False, **common)
    if arch == "gru_attention":
        return create_model("bahdanau-small", num_layers=1, attention=True, **common)
    if arch == "transformer":
        return create_model("seq2seq-small", num_layers=layers, num_heads=4, mlp_ratio=2.0, **common)
    raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")


def train(model: nn.Module, *, steps: int, train_lengths: tuple[int, int], batch_size: int = 64, lr: float = 3e-3,
          seed: int = 0) -> list[float]:
    """AdamW (weight decay 0), linear warm-up over the first 5% then cosine decay, gradient norm clipped at 1;
    every batch fresh, its source lengths uniform in ``train_lengths`` (inclusive). Returns the losses."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    lo, hi = train_lengths
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    losses = []
    for _ in range(steps):
        src, tgt_in, tgt_out = make_batch(torch.randint(lo, hi + 1, (batch_size,), generator=gen), gen)
        loss = model((src, tgt_in), tgt_out).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _chrf(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_chrf(hyps, [refs]).score)


@torch.no_grad()
def evaluate(model: nn.Module, lengths: list[int], *, n: int = 200, seed: int = 1234) -> dict[int, dict[str, float]]:
    """Greedy decoding of ``n`` fresh strings per length: ``{length: {exact_match, chrf, token_accuracy}}`` (%)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for L in lengths:
        src, _, tgt_out = make_batch(torch.full((n,), L), gen)
        hyp = strip_special(greedy_search(model, src, max_len=L + 1), eos_id=EOS, pad_id=PAD)
        ref = [r[:L].tolist() for r in tgt_out]
        em = sum(h == r for h, r in zip(hyp, ref)) / n
        tok = sum(sum(a == b for a, b in zip(h, r)) for h, r in zip(hyp, ref)) / (n * L)
        text = lambda ids: "".join(str(i - 3) if 3 <= i < 13 else "?" for i in ids)  # noqa: E731
        chrf = _chrf([text(h) for h in hyp], [text(r) for r in ref])
        out[L] = {"exact_match": round(100 * em, 2), "chrf": round(chrf, 2), "token_accuracy": round(100 * tok, 2)}
    return out


def run_experiment(*, archs=ARCHS, train_lengths=(1, 12), test_lengths=(2, 4, 6, 8, 10, 12, 14, 16, 20, 24), steps=1000,
                   batch_size=64, dim=64, lr=3e-3, seed=0, n_eval=200, log=print) -> dict:
    """Train each architecture the same way and test it at every length; returns ``{"rows", "models"}``.

    ``rows``: one per (architecture, length) with the metrics of :func:`evaluate` and ``in_training`` (whether
    that length was among the training lengths); ``models``: parameters, seconds, final training loss.
    """
    max_len = max(max(test_lengths), train_lengths[1])
    rows, models = [], {}
    for arch in archs:
        model = build(arch, dim=dim, max_len=max_len)
        t0 = time.perf_counter()
        losses = train(model, steps=steps, train_lengths=train_lengths, batch_size=batch_size, lr=lr, seed=seed)
        secs = time.perf_counter() - t0
        res = evaluate(model, list(test_lengths), n=n_eval)
        models[arch] = {"parameters": sum(p.numel() for p in model.parameters()), "train_seconds": round(secs, 1),
                        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4)}
        for L, m in res.items():
            rows.append({"arch": arch, "length": L, "in_training": train_lengths[0] <= L <= train_lengths[1], **m})
        log(f"  {arch}: {models[arch]['parameters']:,} parameters, {secs:.0f} s, final loss "
            f"{models[arch]['final_loss']}; exact match " + ", ".join(f"L={L}: {m['exact_match']:.0f}%"
                                                                      for L, m in res.items()))
    return {"rows": rows, "models": models}


def claim(rows: list[dict], train_lengths: tuple[int, int], margin: float = 25.0) -> dict:
    """The verdict: exact match lost from the shortest to the longest tested length within training, per arch.

    Holds when the GRU without attention loses at least ``margin`` points more than each attention model;
    ``None`` when one of the three is missing.
    """
    def at(arch, L):
        return next(r for r in rows if r["arch"] == arch and r["length"] == L)["exact_match"]

    inside = sorted({r["length"] for r in rows if r["in_training"]})
    beyond = sorted({r["length"] for r in rows if not r["in_training"]})
    archs = [a for a in ARCHS if any(r["arch"] == a for r in rows)]
    short, long_ = inside[0], inside[-1]
    drop = {a: round(at(a, short) - at(a, long_), 2) for a in archs}
    holds = None
    if set(archs) == set(ARCHS):
        holds = all(drop["gru"] >= drop[a] + margin for a in ("gru_attention", "transformer"))
    parts = ", ".join(f"{LABELS[a]} {at(a, long_):.0f}%" for a in archs)
    measured = f"exact match at length {long_} (longest trained): {parts}"
    if beyond:
        far = beyond[-1]
        measured += f"; at length {far} (untrained): " + ", ".join(f"{LABELS[a]} {at(a, far):.0f}%" for a in archs)
    return {"holds": holds, "measured": measured, "drop": drop, "short": short, "long": long_, "margin": margin}


def plot(path: Path, rows: list[dict], train_lengths: tuple[int, int], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key, ax in zip(("exact_match", "chrf"), axes):
        for arch, mark in zip(ARCHS, "os^"):
            rs = [r for r in rows if r["arch"] == arch]
            if rs:
                ax.plot([r["length"] for r in rs], [r[key] for r in rs], mark + "-", label=LABELS[arch])
        ax.axvspan(train_lengths[0], train_lengths[1], color="0.9", zorder=0, label="training lengths")
        ax.set_xlabel("input length (digits)")
        ax.set_ylabel({"exact_match": "exact match (%)", "chrf": "chrF"}[key])
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--train-lengths", type=int, nargs=2, default=[1, 12], metavar=("LO", "HI"))
    ap.add_argument("--test-lengths", type=int, nargs="+", default=[2, 4, 6, 8, 10, 12, 14, 16, 20, 24])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-eval", type=int, default=200, help="test strings per length")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rnn_forgets.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.stdout.reconfigure(line_buffering=True)
    lo, hi = args.train_lengths
    if not 1 <= lo <= hi or min(args.test_lengths) < 1:
        print("rnn_forgets: lengths must be ≥ 1 and LO ≤ HI", file=sys.stderr)
        return 2
    if not any(lo <= L <= hi for L in args.test_lengths):
        print("rnn_forgets: at least one test length must be a training length", file=sys.stderr)
        return 2
    load = [os.getloadavg()]
    t0 = time.perf_counter()
    res = run_experiment(archs=args.archs, train_lengths=(lo, hi), test_lengths=sorted(set(args.test_lengths)),
                         steps=args.steps, batch_size=args.batch_size, dim=args.dim, lr=args.lr, seed=args.seed,
                         n_eval=args.n_eval)
    load.append(os.getloadavg())
    rows, c = res["rows"], claim(res["rows"], (lo, hi))
    run = (f"digit-string reversal, trained on lengths {lo}–{hi} ({args.steps} steps of {args.batch_size}, "
           f"dim {args.dim}, seed {args.seed}), greedy decoding of {args.n_eval} fresh strings per length")
    print(f"\n{run}\n")
    lengths = sorted({r["length"] for r in rows})
    print("| length | " + " | ".join(f"{LABELS[a]} EM % / chrF" for a in args.archs) + " |")
    print("| ---: |" + " ---: |" * len(args.archs))
    for L in lengths:
        cells = [next(r for r in rows if r["arch"] == a and r["length"] == L) for a in args.archs]
        mark = "" if lo <= L <= hi else " (untrained)"
        print(f"| {L}{mark} | " + " | ".join(f"{r['exact_match']:.1f} / {r['chrf']:.1f}" for r in cells) + " |")
    verdict = {True: "holds", False: "does not hold", None: "not decided (an architecture is missing)"}[c["holds"]]
    print(f"\nexact match lost from length {c['short']} to {c['long']}: "
          + ", ".join(f"{LABELS[a]} {d:+.1f} points" for a, d in c["drop"].items()) + f" — the claim {verdict}.")
    mach, com = machine(), commit()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "rnn_forgets",
              "claim": {"holds": c["holds"], "measured": c["measured"], "run": run},
              "command": " ".join(["python", "bench/rnn_forgets.py", *(sys.argv[1:] if argv is None else argv)]),
              "commit": com, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**mach, "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "load_average": load, "wall_seconds": round(time.perf_counter() - t0, 1)},
              "settings": {"task": "reverse digits", "train_lengths": [lo, hi], "test_lengths": lengths,
                           "steps": args.steps, "batch_size": args.batch_size, "dim": args.dim, "lr": args.lr,
                           "seed": args.seed, "n_eval": args.n_eval},
              "exact_match_drop": c["drop"], "models": res["models"], "rows": rows}
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(out.with_suffix(".png"), rows, (lo, hi), f"Reversing digit strings, trained on lengths {lo}–{hi}\n"
         f"exact match lost from length {c['short']} to {c['long']}: "
         + ", ".join(f"{LABELS[a]} {d:.0f} points" for a, d in c["drop"].items()))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
