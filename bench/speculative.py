"""Speculative decoding against plain decoding: tokens/s, acceptance rate and an identical-output check.

Greedy decoding of one language-model run (default: SmolLM2-135M-Instruct imported from its GGUF file, see the
README's section on imports) on two workloads, each decoded plainly (``tokennet.sampling.stream``, the compiled
one-token step), with n-gram drafts (prompt lookup) and, with ``--draft RUN`` or ``--draft-layers L``, with a draft
model (``tokennet.speculative``):

- ``rewrite``: a chat request to rewrite a given passage with two small edits — the reply repeats its input, where
  n-gram drafts should be accepted;
- ``chat``: an open question (a plain-text reply that repeats nothing), where drafts mostly fail and the adaptive
  draft length should fall back to plain steps.

``--draft-layers L`` builds a draft run from the target's own first L layers (its embedding, final norm and head kept;
no training), written to a temporary directory with the target's tokenizer: SmolLM2 has no smaller model over its
vocabulary. Every mode runs in this one process on the same prompt, once unrecorded (compilation), then in a rotated
order each round; the table gives the median over rounds. Greedy output must be token for token plain decoding's
(``identical``).

    python bench/speculative.py --run runs/smollm2 [--draft RUN | --draft-layers 8] [--new-tokens 128]
                                [--rounds 3] [--draft-tokens 8] [--threads N] [--no-compile] [--quantize none]

Writes ``bench/results/speculative.json`` (the command, the commit, the machine with its load average before and
after, and every round's figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import ROOT, commit, machine  # noqa: E402

import tokennet  # noqa: E402
from tokennet.data.chats import render_chat  # noqa: E402
from tokennet.models.registry import config_from_dict, load_state_assigned, model_from_config, save_pretrained  # noqa: E402
from tokennet.run import read_run_info, save_tokenizer, write_run_info  # noqa: E402
from tokennet.sampling import stream  # noqa: E402
from tokennet.speculative import ModelDrafter, NgramDrafter, SpeculationStats, stream_speculative  # noqa: E402

PASSAGE = ("The river ran past the old mill every morning, carrying leaves and small branches down from the hills. "
           "Children from the village came to watch the water wheel turn, and the miller, a patient man with flour "
           "in his beard, let them stand by the door while he worked. In the evening the river grew quiet, and the "
           "mill stood dark against the sky until the first light came over the hills again.")
WORKLOADS = {
    "rewrite": "Rewrite the following passage exactly, word for word, but replace 'river' with 'stream' and "
               "'miller' with 'baker'. Do not change anything else.\n\n" + PASSAGE,
    "chat": "What are three good habits for someone learning to play the piano? Explain each in a few sentences.",
}


def truncated_draft(target: str, layers: int, out: Path) -> Path:
    """A draft run of the target's first ``layers`` layers (embedding, final norm and head kept), same tokenizer."""
    run = tokennet.load(target)
    cfg = {**run.model.config.to_dict(), "num_layers": layers}
    model = model_from_config(config_from_dict(cfg))
    own = model.state_dict()
    load_state_assigned(model, {k: v for k, v in run.model.state_dict().items() if k in own})
    save_pretrained(model, out)
    save_tokenizer(out, run.tokenizer)
    info = read_run_info(target)
    write_run_info(out, recipe=info["recipe"], model=info["model"], data=None,
                   settings={**info["settings"], "num_layers": layers})
    return out


def decode(mode: str, run, ids: torch.Tensor, args, draft_run) -> dict:
    """One greedy decoding of ``args.new_tokens`` tokens in ``mode``: its tokens, seconds and speculation stats."""
    stop = getattr(run.tokenizer, "stop_ids", None)
    common = dict(temperature=0, stop=stop, compile=not args.no_compile, quantize=args.quantize)
    stats = SpeculationStats()
    t0 = time.perf_counter()
    if mode == "plain":
        tokens = [int(t[0]) for t in stream(run.model, ids, args.new_tokens, **common)]
    else:
        drafter = NgramDrafter() if mode == "ngram" else ModelDrafter(
            draft_run.model, run.model.config.vocab_size, temperature=0, compile=not args.no_compile,
            quantize=args.quantize)
        tokens = [int(t[0]) for t in stream_speculative(run.model, ids, args.new_tokens, drafter=drafter,
                                                        draft_tokens=args.draft_tokens, stats=stats, **common)]
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
            "acceptance_rate": stats.acceptance_rate, "drafted": stats.drafted, "accepted": stats.accepted,
            "verifications": stats.verifications, "plain_steps": stats.plain_steps}


def bench_workload(name: str, run, draft_run, modes: list[str], args) -> dict:
    """Every mode, ``args.rounds`` times in a rotated order; medians and the identical-output check."""
    prompt = render_chat(run.tokenizer, [{"role": "user", "content": WORKLOADS[name]}], where=str(run.path))
    ids = torch.tensor([run.tokenizer.encode(prompt)])
    for mode in modes:  # a pass not recorded: compiles every step at this prompt's length
        decode(mode, run, ids, args, draft_run)
    rounds: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[: r % len(modes)]:
            rounds[mode].append(decode(mode, run, ids, args, draft_run))
    plain = rounds["plain"][0]["tokens"]
    out = {"prompt_tokens": ids.shape[1], "reply": run.tokenizer.decode(plain), "modes": {}}
    for mode, runs in rounds.items():
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        out["modes"][mode] = {
            "tokens": len(runs[0]["tokens"]), "tokens_per_s": tps,
            "speedup": tps / statistics.median(x["tokens_per_s"] for x in rounds["plain"]),
            "acceptance_rate": runs[0]["acceptance_rate"], "identical": all(x["tokens"] == plain for x in runs),
            "rounds": [{k: v for k, v in x.items() if k != "tokens"} for x in runs]}
    return out


def table(results: dict) -> str:
    lines = [f"{'workload':<9} {'mode':<6} {'tokens':>6} {'tokens/s':>9} {'speedup':>8} {'accepted':>9} identical"]
    for name, res in results.items():
        for mode, m in res["modes"].items():
            acc = "-" if mode == "plain" else f"{100 * m['acceptance_rate']:.0f}%"
            lines.append(f"{name:<9} {mode:<6} {m['tokens']:>6} {m['tokens_per_s']:>9.1f} {m['speedup']:>7.2f}x "
                         f"{acc:>9} {m['identical']}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the target run (e.g. SmolLM2 imported with `tokennet import`)")
    p.add_argument("--draft", help="a draft run with the target's tokenizer")
    p.add_argument("--draft-layers", type=int, help="build a draft from the target's first L layers")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--draft-tokens", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-compile", action="store_true", help="plain steps eager (default: the compiled step)")
    p.add_argument("--quantize", default="auto", help="as generate --quantize (default auto: a GGUF run's int4)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "speculative.json"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    run = tokennet.load(args.run)
    modes = ["plain", "ngram"]
    with tempfile.TemporaryDirectory() as tmp:
        draft = args.draft or (str(truncated_draft(args.run, args.draft_layers, Path(tmp) / "draft"))
                               if args.draft_layers else None)
        draft_run = tokennet.load(draft) if draft else None
        modes += ["draft"] if draft_run else []
        results = {name: bench_workload(name, run, draft_run, modes, args) for name in WORKLOADS}
    print(table(results))
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit(),
              "machine": machine(torch=torch.__version__, threads=torch.get_num_threads(),
                                 load_average_before=load_before, load_average_after=os.getloadavg()),
              "run": args.run, "draft": args.draft or (f"first {args.draft_layers} layers of the target"
                                                       if args.draft_layers else None),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "results": results}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
