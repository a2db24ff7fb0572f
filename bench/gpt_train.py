"""GPT training speed on Tiny Shakespeare (character level), against nanoGPT's CPU figures.

Modes (run with nothing else on the machine; 2-thread PyTorch is very sensitive to other processes):

- ``throughput``: nanoGPT's exact model and optimizer settings (4 layers, 4 heads, width 128, block 64,
  batch 12, no bias, dropout 0, AdamW lr 1e-3 β2 0.99 wd 0.1, clip 1). Median ms per training step of
  tokennet's GPT and of a nanoGPT-structured reference model (fused c_attn, written here after
  nanoGPT's model.py), interleaved in rounds so both see the same machine state; tokens/s for both.
- ``nanogpt-run``: the full nanoGPT CPU command with tokennet (`gpt-char` recipe, 2000 iterations, eval
  every 250 on 20 batches): wall time and the val-loss curve.
- ``best``: tokennet's own fastest recipe to val loss ≤ 1.886 (nanoGPT's 2000-iteration figure):
  wall time and the val-loss-vs-seconds curve.

Baseline (../shared/data/BASELINES.md, same kind of machine): nanoGPT 62.9 ms/step (≈12,200 tokens/s),
val loss 1.8857 after 2000 iterations in 141 s.

    python bench/gpt_train.py throughput
    python bench/gpt_train.py nanogpt-run
    python bench/gpt_train.py best
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
NANOGPT_MS, NANOGPT_TOK_S, NANOGPT_WALL, NANOGPT_VAL = 62.9, 12_200, 141.2, 1.8857
NANOGPT_SETTINGS = {"dim": 128, "num_layers": 4, "num_heads": 4, "block_size": 64, "bias": False, "dropout": 0.0,
                    "batch_size": 12, "lr": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "weight_decay": 0.1,
                    "beta1": 0.9, "beta2": 0.99, "grad_clip": 1.0, "eval_iters": 20, "eval_interval": 250,
                    "max_iters": 2000, "val_fraction": 0.1, "sample_tokens": 0, "position": "learned",
                    "tie_weights": True, "time_budget": None}
# tokennet's own recipe for speed to 1.886: longer context, higher learning rate, a little wider.
BEST_SETTINGS = {"dim": 128, "num_layers": 4, "num_heads": 4, "block_size": 128, "bias": False, "dropout": 0.0,
                 "batch_size": 16, "lr": 3e-3, "min_lr": 3e-4, "warmup_iters": 50, "weight_decay": 0.1,
                 "beta2": 0.99, "grad_clip": 1.0, "eval_iters": 20, "eval_interval": 50, "max_iters": 1200,
                 "val_fraction": 0.1, "sample_tokens": 0, "target_val_loss": NANOGPT_VAL, "time_budget": None}


class _NanoBlock(nn.Module):
    """One block laid out as nanoGPT's model.py: fused c_attn, SDPA causal attention, GELU MLP."""

    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPTReference(nn.Module):
    def __init__(self, vocab, block, d, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_NanoBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def _env() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu,
            "python": sys.version.split()[0]}


def throughput(args) -> dict:
    from tokennet.data.text import LMBatches
    from tokennet.models import create_model
    from tokennet.tokens.text import CharTokenizer
    from tokennet.train import configure_optimizer

    text = DATA.read_text()
    tok = CharTokenizer.train(text)
    ids = torch.tensor(tok.encode(text[: int(len(text) * 0.9)]))
    src = LMBatches(ids, 64, 12, seed=0)
    torch.manual_seed(0)
    ours = create_model("gpt", vocab_size=tok.vocab_size, block_size=64, dim=128, num_layers=4, num_heads=4,
                        bias=False, dropout=0.0)
    ref = NanoGPTReference(tok.vocab_size, 64, 128, 4, 4)
    systems = {
        "tokennet": (ours, configure_optimizer(ours, lr=1e-3, betas=(0.9, 0.99)), lambda m, x, y: m(x, y).loss),
        "nanogpt-style reference": (ref, torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.99)),
                                    lambda m, x, y: m(x, y)),
    }
    times = {k: [] for k in systems}
    i = 0
    for rnd in range(args.rounds):
        for name, (model, opt, fwd) in systems.items():
            for j in range(args.steps_per_round):
                x, y = src.batch(i)
                i += 1
                t = time.perf_counter()
                loss = fwd(model, x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if rnd > 0 or j >= 5:  # warm-up steps are not timed
                    times[name].append(time.perf_counter() - t)
    rows = []
    for name, ts in times.items():
        ms = statistics.median(ts) * 1000
        rows.append({"system": name, "median_ms": round(ms, 2), "tokens_per_s": round(768 / ms * 1000),
                     "vs_nanogpt_baseline": round(NANOGPT_MS / ms, 2)})
    rows.append({"system": "nanoGPT (BASELINES.md)", "median_ms": NANOGPT_MS, "tokens_per_s": NANOGPT_TOK_S,
                 "vs_nanogpt_baseline": 1.0})
    print("| system | median ms/step | tokens/s | speed vs nanoGPT baseline |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['system']} | {r['median_ms']} | {r['tokens_per_s']:,} | {r['vs_nanogpt_baseline']}× |")
    ratio = statistics.median(times["nanogpt-style reference"]) / statistics.median(times["tokennet"])
    print(f"\ntokennet vs the in-script nanoGPT-style reference, same machine state: {ratio:.2f}× faster")
    return {"rows": rows, "ratio_vs_reference": round(ratio, 3), "samples": {k: len(v) for k, v in times.items()}}


def _run_recipe(settings: dict, label: str) -> dict:
    from tokennet.recipes import train

    sets = {**settings}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        out, metrics = train("gpt-char", data=str(DATA), out=Path(d) / "run", sets={**sets, "progress": False})
        wall = time.perf_counter() - t0
        log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    # Curve: (seconds since launch, step, val loss). Setup time (reading, tokenizing, building) is
    # wall - the trainer's own wall, added so the curve is "from launch" like nanoGPT's figures.
    setup = wall - metrics["wall"] if "wall" in metrics else 0.0
    curve = [{"step": r["step"], "seconds": round(r["wall"] + setup, 2), "val_loss": round(r["val_loss"], 4)}
             for r in log if "val_loss" in r and "wall" in r]
    hit = next((c for c in curve if c["val_loss"] <= NANOGPT_VAL), None)
    print(f"\n{label}: {metrics['step']} steps, final val loss {metrics['val_loss']:.4f}, wall {wall:.1f} s")
    print("| step | seconds from launch | val loss |\n| --- | --- | --- |")
    for c in curve:
        print(f"| {c['step']} | {c['seconds']} | {c['val_loss']} |")
    if hit:
        print(f"val loss ≤ {NANOGPT_VAL} at step {hit['step']}, {hit['seconds']} s from launch "
              f"(nanoGPT: step 2000, {NANOGPT_WALL} s → {NANOGPT_WALL / hit['seconds']:.2f}× faster)")
    return {"settings": settings, "wall_seconds": round(wall, 2), "final": metrics, "curve": curve,
            "reached_target": hit}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["throughput", "nanogpt-run", "best"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps-per-round", type=int, default=25)
    p.add_argument("--set", dest="sets", nargs="*", default=[], help="override the best recipe's settings")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not DATA.is_file():
        sys.exit(f"{DATA} not found: this benchmark needs Tiny Shakespeare (see ../shared/data/README.md)")
    if args.mode == "throughput":
        res = throughput(args)
    elif args.mode == "nanogpt-run":
        res = _run_recipe(NANOGPT_SETTINGS, "tokennet with nanoGPT's settings")
    else:
        extra = {k: json.loads(v) if v[:1].isdigit() or v[:1] in "-[{" else v
                 for k, v in (s.split("=", 1) for s in args.sets)}
        res = _run_recipe({**BEST_SETTINGS, **extra}, "tokennet best recipe")
    res["env"] = _env()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpt_train_{args.mode}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
