"""The ``tokennet`` command: parses arguments, calls recipes / generate / viz, prints.

Expected failures (bad input, missing files, a run directory in the way) print one line
``tokennet: error: ...`` and exit with status 2; an interrupted run exits with 130 after saving a
checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

EPILOG = """examples:
  tokennet train gpt                         # BPE GPT on Python's docs, prints a sample
  tokennet train gpt-char --data input.txt --max-iters 2000
  tokennet generate runs/gpt --prompt "The " --max-new-tokens 200
  tokennet eval runs/gpt
  tokennet train vit                         # ViT on 8x8 digits, next to an RBF SVM
  tokennet viz runs/vit --index 3            # attention maps, rollout, position similarity (PNG)
  tokennet list
"""


class CLIError(Exception):
    """An expected failure: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other tokennet error), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"tokennet: error: {message} (see `{self.prog} --help`)\n")


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a recipe into a run directory",
        description="Train RECIPE (see `tokennet list`) and write a run directory: config.json, "
        "model.safetensors, tokenizer.json (text), metrics.json, log.jsonl, run.json, checkpoints/.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings: any model config field, trainer field or recipe option, e.g.\n"
        "  --set dim=256 num_layers=6 lr=3e-4 batch_size=64 tokenizer=char precision=bf16\n"
        "`tokennet train RECIPE --show-settings` lists them with their defaults.",
    )
    p.add_argument("recipe", help="recipe name, e.g. gpt, gpt-char")
    p.add_argument("--data", help="data: a text file, directory or glob (recipe-specific; default: embedded)")
    p.add_argument("--out", help="run directory (default: runs/RECIPE)")
    p.add_argument("--max-iters", type=int,
                   help="optimizer steps; given alone, it replaces the recipe's default time budget")
    p.add_argument("--time-budget", type=float, metavar="SEC",
                   help="stop after SEC seconds of training (evaluation excluded); the learning-rate schedule "
                   "then follows time")
    p.add_argument("--seed", type=int, help="random seed (data order, init, dropout)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N, mps")
    p.add_argument("--set", dest="sets", nargs="+", default=[], metavar="KEY=VALUE", help="override settings")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    g.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--show-settings", action="store_true",
                   help="print the recipe's settings with their defaults (for the --data given, where the recipe "
                   "has per-dataset profiles) and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_generate(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="sample text (language models), translate (seq2seq), caption or classify --image files",
        description="Language-model runs: continue a prompt, streaming tokens as they come. Decoding "
        "uses a KV cache. Past the model's context length the model sees a sliding window: the cache is "
        "rebuilt from the last block_size/2 tokens whenever it fills. Translation runs (seq2seq): translate "
        "--prompt with beam search (characters outside the vocabulary are read as <unk> and listed on "
        "stderr). Captioning runs: caption the --image files. Image classification runs (vit): print each --image "
        "file's class index and probability. Audio classification runs (audio): print each --audio file's class "
        "index, name and probability. What a run can do is its task's (see tokennet.tasks).",
    )
    p.add_argument("run_dir", help="a run directory from `tokennet train`")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (>= 1)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy; higher = more random")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole window every step")
    p.add_argument("--quantize", choices=("none", "bf16", "int8", "int4"), default="none",
                   help="language models: decode with low-precision weights in every linear layer and the LM head, "
                   "converted when generation starts (the saved run is not changed): bf16; int8 weight-only with "
                   "one scale per output channel (bf16 activations); int4: 4-bit blocks of 32 weights with a scale "
                   "and a minimum each (GGUF's Q4_1; the LM head in Q8_0), and a run imported from a GGUF file "
                   "keeps the file's own Q4_0/Q4_1/Q8_0 blocks as they are (layers whose width is not a multiple "
                   "of 32 stay float32, with a note). Fewer bytes per weight read per token make decoding faster, "
                   "at a small cost in accuracy; which is faster depends on the CPU (default: none: float32 "
                   "weights, which on the CPU decode from a copy packed in column blocks, one per thread)")
    p.add_argument("--chat", action="store_true",
                   help="language models with a chat template (imported GGUF models such as SmolLM2-Instruct): send "
                   "--prompt as a user message through the template and print only the reply")
    p.add_argument("--beam-size", type=int, default=None,
                   help="translation and captioning runs: beam width, 1 = greedy (default: the run's beam_size)")
    p.add_argument("--image", nargs="+", metavar="PATH",
                   help="captioning runs: caption these image files (PNG, JPEG, ... or .npy) of the model's size "
                   "(48×48 for the caption recipe; nothing is resized), one caption per line; image "
                   "classification runs: classify them (PATH, class index, probability per line)")
    p.add_argument("--audio", nargs="+", metavar="FILE",
                   help="audio classification runs (the audio recipe): classify these audio files (WAV; OGG/FLAC "
                   "with the soundfile package), read as mono and resampled to the model's rate; prints FILE, "
                   "class index, class name and probability per line. A clip longer than the model's maximum "
                   "(clip_samples, 1 s for spoken digits) is an error, not cropped; shorter ones are zero-padded")


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a run and print its metrics as JSON",
                       description="Evaluate a trained run on its own held-out split, or on --data. An "
                       "imported language model (`tokennet import`) has no split of its own: --data FILE is required, "
                       "and its next-token loss and perplexity on that text file are printed (non-overlapping "
                       "windows of up to 1,024 tokens, at most 262,144 tokens read).")
    p.add_argument("run_dir")
    p.add_argument("--data", help="evaluate on this data instead of the run's validation split")
    p.add_argument("--device", default="auto")


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="small demonstrations from the lecture",
                       description="nadaraya-watson: attention pooling as kernel regression on the lecture's "
                       "toy problem; writes a figure and metrics.")
    p.add_argument("name", choices=["nadaraya-watson"])
    p.add_argument("--out", default=None, help="output directory (default: runs/NAME)")
    p.add_argument("--seed", type=int, default=0)


def _add_viz(sub) -> None:
    p = sub.add_parser(
        "viz",
        help="draw a trained model's attention (PNG)",
        description="Draw pictures of a trained run, chosen by its task. Language models: token-to-token "
        "causal attention over --text, per layer and head. Graphs: the attention of one node (--patch, default a "
        "marked node) over a test graph (--index), and its Laplacian positions as node colours. Spheres: one patch's "
        "attention (--patch) over the sphere, per layer (view from the pole) and in a Mollweide map. Imported text "
        "encoders: bidirectional token attention over --text. ViT: where one "
        "patch looks "
        "(per layer and head, over a test image or --image), the <cls> token's attention rollout, and the "
        "similarity of the position embeddings. Translation: the cross-attention alignment (output × source "
        "characters, per layer and head) of a test example or --text. Captioning: each generated word's "
        "attention over the image patches, for a held-out test image or --image. Attention is recomputed "
        "with the plain formula, so runs trained with the fused backend work.",
    )
    p.add_argument("run_dir", help="a run directory from `tokennet train`")
    p.add_argument("--out", help="output directory (default: RUN_DIR/viz)")
    p.add_argument("--index", type=int, help="which test example to draw (default 0)")
    p.add_argument("--patch", type=int, help="the query patch, row-major (default: the centre patch)")
    p.add_argument("--layer", type=int, help="only this layer (default: all)")
    p.add_argument("--head", type=int, help="only this head (default: all, and their mean)")
    p.add_argument("--data", help="the data to draw from (default: the run's)")
    p.add_argument("--text", help="language models: the text whose attention to draw (default: a fixed sentence); "
                   "translation (seq2seq) runs: draw the alignment of this source instead of a test example")
    p.add_argument("--image", metavar="PATH",
                   help="captioning runs: caption this image file (the model's size) and draw its attention; "
                   "ViT runs: draw this image instead of a test image")
    p.add_argument("--audio", metavar="FILE",
                   help="audio classification runs: draw this audio file's spectrogram with the attention rollout "
                   "over its patches instead of a test clip's (clips longer than the model's maximum are an error)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write one self-contained HTML page about a run (curves, samples, predictions, attention)",
        description="Write RUN_DIR/report.html: the run's status, wall time, parameter count and throughput; "
        "metrics.json as stored; loss against steps and against seconds, learning rate and gradient norm from "
        "log.jsonl; what the task's model does (language models: samples at several temperatures and the "
        "per-token loss of validation text; classifiers: a confusion matrix, the most confident mistakes and "
        "attention rollout; translation and captioning: held-out inputs, references and outputs with the misses "
        "marked, and the cross-attention picture); the command that reproduces the run, with the settings that "
        "differ from the recipe defaults highlighted; the machine. One file: pictures inline, no scripts, "
        "readable offline. Training writes it too, at every checkpoint (curves only) and at the end "
        "(--set report=false turns that off).",
        epilog="example: tokennet report runs/gpt-char && xdg-open runs/gpt-char/report.html",
    )
    p.add_argument("run_dir", help="a run directory from `tokennet train` (finished, running or interrupted)")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default: RUN_DIR/report.html)")
    p.add_argument("--device", default="cpu", help="where to run the model for samples and predictions "
                   "(cpu by default; auto, cuda, ...)")


def _add_import(sub) -> None:
    p = sub.add_parser(
        "import",
        help="convert a foreign checkpoint (Hugging Face GPT-2, ViT) into a tokennet run directory",
        description="Convert the checkpoint in SOURCE onto tokennet's own modules and write an ordinary run "
        "directory (config.json, model.safetensors, run.json) that `generate`, `viz` and tokennet.load use "
        "without transformers. SOURCE is a Hugging Face directory (config.json + model.safetensors) of "
        "GPT2LMHeadModel (→ gpt) or ViTForImageClassification (→ vit). Every config field and every tensor must "
        "be accounted for: an unknown field, an unused or missing tensor stops the import with one line, and "
        "nothing is written. Not imported: tokenizers and image preprocessors (a note says so).",
    )
    p.add_argument("source", help="a Hugging Face checkpoint directory")
    p.add_argument("--out", required=True, help="the new run directory (must not exist, or be empty)")


def _add_embed(sub) -> None:
    p = sub.add_parser(
        "embed",
        help="sentence embeddings of texts from a text-encoder run (e.g. imported all-MiniLM-L6-v2)",
        description="Print one JSON list per --text: the sentence embedding as the model defines it (mean of "
        "the token states over the real tokens, L2-normalized), and, with two or more texts, their cosine "
        "similarities. Texts longer than the model's context are truncated (a warning on stderr says so).",
    )
    p.add_argument("run_dir", help="a text-encoder run (tokennet import of a BertModel directory)")
    p.add_argument("--text", action="append", required=True, help="a text to embed (repeat for several)")


def _add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a run as ONNX, a torch.export program, a GGUF file (llama.cpp) or a Hugging Face directory",
        description="Export RUN_DIR. onnx / pt2: the network with dynamic batch (and sequence length): gpt: token "
        "ids (B, T) → logits (B, T, V); vit: images (B, C, H, W) → logits (B, K); seq2seq: the encoder only; "
        "text-encoder: ids → embeddings; NOT exported: the decoding loop, tokenizers and input checks. gguf: a gpt "
        "run (GPT-2 or Llama configuration) with its tokenizer and chat template as llama.cpp's converter writes "
        "them. hf: a gpt run as a directory transformers' AutoModelForCausalLM and AutoTokenizer load. The result "
        "is read back (onnxruntime, torch.export.load, tokennet's importers) and run on two input shapes against "
        "the run's model; it is written only if every output is within the tolerance.",
    )
    p.add_argument("run_dir", help="a run directory (trained or imported)")
    p.add_argument("--format", required=True, choices=["onnx", "pt2", "gguf", "hf"],
                   help="onnx (torch.onnx.export with dynamo=True; needs onnx, onnxscript, onnxruntime), pt2 "
                   "(torch.export.save), gguf (needs the gguf package) or hf")
    p.add_argument("--out", required=True, help="the file to write (a directory for --format hf), e.g. model.onnx")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (otherwise it is refused)")
    p.add_argument("--gguf-type", choices=["f32", "f16", "q8_0"], default="f16",
                   help="GGUF: the type of the matrices (default f16, as llama.cpp's converter); vectors and norms "
                   "stay f32, and weights the run holds in GGUF blocks (an imported file's) are written as they are")
    p.add_argument("--tolerance", type=float, default=None,
                   help="replace the default check (every output within 1e-4·max|output| + 1e-4·|output| of the "
                   "run's, like torch.testing.assert_close scaled to the outputs) by an absolute limit on "
                   "max |exported − PyTorch|")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokennet",
        description="tokennet: turn any data into tokens, then one generic transformer processes the tokens.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"tokennet {_version()}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("list", help="list models and recipes", description="List registered models and recipes.")
    _add_train(sub)
    _add_generate(sub)
    _add_eval(sub)
    _add_demo(sub)
    _add_viz(sub)
    _add_report(sub)
    _add_import(sub)
    _add_export(sub)
    _add_embed(sub)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def cmd_list(args) -> int:
    from .models.registry import list_models, preset_info
    from .recipes import list_recipes

    print("models:")
    for name in list_models():
        print(f"  {name:<18} {preset_info(name)[2]}")
    print("recipes:")
    for r in list_recipes():
        print(f"  {r.name:<18} {r.description}")
    return 0


def cmd_train(args) -> int:
    from .recipes import get_recipe, parse_sets, train

    recipe = get_recipe(args.recipe)
    defaults = recipe.defaults(args.data)  # the dataset's profile, where the recipe has one
    if args.show_settings:
        for k in sorted(defaults):
            print(f"{k} = {defaults[k]!r}")
        return 0
    sets = parse_sets(args.sets, defaults)
    for flag, key in (("max_iters", "max_iters"), ("time_budget", "time_budget"), ("seed", "seed")):
        v = getattr(args, flag)
        if v is not None:
            if key in sets and sets[key] != v:
                raise CLIError(f"--{flag.replace('_', '-')} {v} conflicts with --set {key}={sets[key]}")
            sets[key] = v
    if args.no_progress or not sys.stderr.isatty():
        sets.setdefault("progress", False)
    out = Path(args.out) if args.out else Path("runs") / recipe.name
    try:
        run_dir, metrics = train(recipe.name, data=args.data, out=out, sets=sets, device=args.device,
                                 resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(f"tokennet: interrupted; a checkpoint is in {out / 'checkpoints'}; "
              f"continue with: tokennet train {recipe.name} --out {out} --resume", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 prints
        return 0
    sample = metrics.pop("sample", None)
    print(json.dumps(metrics, indent=2))
    if sample is not None:
        print("\n--- sample ---")
        print(sample)
    print(f"\nrun directory: {run_dir}")
    return 0


def _load_run(run_dir: str, device: str = "cpu"):
    from .run import load

    return load(run_dir, device=device)


def cmd_generate(args) -> int:
    """Dispatch on the run's task verbs: generate text, translate the prompt, caption or classify --image."""
    from .device import resolve_device

    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.beam_size is not None and args.beam_size < 1:
        raise CLIError(f"--beam-size must be >= 1, got {args.beam_size}")
    run = _load_run(args.run_dir, resolve_device(args.device))
    verbs = run.task.verbs
    if args.image and not {"caption", "classify"} & set(verbs):
        raise CLIError(f"--image is for captioning and image classification runs; {args.run_dir} is a "
                       f"{run.task.name} run")
    if args.quantize != "none" and "generate" not in verbs:
        raise CLIError(f"--quantize is for language-model runs; {args.run_dir} is a {run.task.name} run")
    if args.audio and run.task.kind != "audio-classifier":
        raise CLIError(f"--audio is for audio classification runs; {args.run_dir} is a {run.task.name} run")
    if "caption" in verbs:
        if not args.image:
            raise CLIError(f"{args.run_dir} is a captioning run: it takes images, not a prompt; pass --image PATH")
        for path, cap in zip(args.image, run.caption(args.image, beam_size=args.beam_size), strict=True):
            print(cap if len(args.image) == 1 else f"{path}\t{cap}")
    elif "classify" in verbs and run.task.kind == "audio-classifier":
        if not args.audio:
            raise CLIError(f"{args.run_dir} is an audio classification run: pass --audio FILE ...")
        names = run.task.label_names(run)
        for path, (label, prob) in zip(args.audio, run.classify(args.audio), strict=True):
            print(f"{path}\t{label}\t{names[label] if names else label}\t{prob:.4f}")
    elif "classify" in verbs:
        if not args.image:
            raise CLIError(f"{args.run_dir} is an image classification run: pass --image PATH ...")
        for path, (label, prob) in zip(args.image, run.classify(args.image), strict=True):
            print(f"{path}\t{label}\t{prob:.4f}")
    elif "translate" in verbs:
        out, unknown = run.translate(args.prompt, beam_size=args.beam_size, return_unknown=True)
        if unknown:
            print(f"tokennet: warning: characters outside the vocabulary read as <unk>: {''.join(unknown)!r}",
                  file=sys.stderr)
        print(out)
    elif "generate" in verbs:
        from .tasks.language import stream_text

        prompt = args.prompt
        if args.chat:
            if not getattr(run.tokenizer, "chat_template", None):
                raise CLIError(f"{args.run_dir} has no chat template (only imported chat models have one)")
            prompt = run.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        else:
            sys.stdout.write(args.prompt)
        for piece in stream_text(run, prompt, args.max_new_tokens, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache,
                                 quantize=args.quantize):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        raise CLIError(f"{args.run_dir} is a {run.task.name} run: it has nothing to generate")
    return 0


def cmd_eval(args) -> int:
    from .device import resolve_device
    from .recipes import get_recipe

    run = _load_run(args.run_dir, resolve_device(args.device))
    if run.recipe == "import":  # an imported checkpoint has no split of its own: it is evaluated on --data
        if args.data is None:
            raise CLIError(f"{args.run_dir} is an imported checkpoint with no held-out split of its own: "
                           "give --data FILE (a text file) to measure its loss and perplexity on")
        if not hasattr(run.task, "evaluate_text"):
            raise CLIError(f"{args.run_dir} is an imported {run.task.name}: tokennet eval measures imported "
                           "language models only")
        path = Path(args.data)
        if not path.is_file():
            raise CLIError(f"--data {args.data}: no such file")
        text = path.read_text(encoding="utf-8", errors="replace")
        metrics = run.task.evaluate_text(run, text)
        if metrics["truncated"]:
            print(f"tokennet: {args.data} is longer than 262,144 tokens: evaluated on its first 262,144",
                  file=sys.stderr)
        print(json.dumps(metrics, indent=2))
        return 0
    if run.recipe is None:
        raise CLIError(f"{args.run_dir} is a saved model without run.json: no recipe to evaluate it with")
    recipe = get_recipe(run.recipe)
    if recipe.evaluate_run is None:
        raise CLIError(f"recipe {recipe.name} has no evaluation")
    print(json.dumps(recipe.evaluate_run(run, args.data), indent=2))
    return 0


def cmd_demo(args) -> int:
    from .nadaraya_watson import run_demo

    out = Path(args.out or f"runs/{args.name}")
    metrics = run_demo(out, seed=args.seed)
    print(json.dumps(metrics, indent=2))
    print(f"figure: {out / 'nadaraya_watson.png'}")
    return 0


def cmd_viz(args) -> int:
    from .device import resolve_device
    from .viz import visualize

    # Every viz option goes to the task's function, which uses those it knows (see tokennet.viz).
    options = {k: v for k, v in vars(args).items() if k not in ("command", "quiet", "run_dir", "out", "device")}
    run = _load_run(args.run_dir, str(resolve_device(args.device)))
    for f in visualize(run, args.out, **options):
        print(f)
    return 0


def cmd_report(args) -> int:
    from .device import resolve_device
    from .errors import RecipeError
    from .recipes import get_recipe
    from .run import read_run_info
    from .viz.report import write_report

    info = read_run_info(args.run_dir)  # a clear error for a directory that is not a run
    try:  # the recipe's defaults, for the settings diff (an imported or foreign run has none)
        defaults = get_recipe(info["recipe"]).defaults(info.get("data")) if info.get("recipe") else None
    except RecipeError:
        defaults = None
    print(write_report(args.run_dir, args.out, defaults=defaults, device=str(resolve_device(args.device))))
    return 0


def cmd_import(args) -> int:
    from .interop import import_checkpoint

    r = import_checkpoint(args.source, args.out)
    print(f"{r.path}: {r.converter} → tokennet {r.model.config.family} "
          f"({sum(p.numel() for p in r.model.parameters()):,} parameters)")
    return 0


def cmd_export(args) -> int:
    from .interop.export import export_run

    r = export_run(_load_run(args.run_dir, "cpu"), args.out, args.format, tolerance=args.tolerance,
                   overwrite=args.overwrite, gguf_type=args.gguf_type)
    checks = ", ".join(f"{shape}: {d:.1e}" for shape, d in r.max_diff.items())
    print(f"{r.path}: {r.format}, {', '.join(r.inputs)} → {', '.join(r.outputs)}; max |diff| vs PyTorch {checks}")
    if r.path.is_dir():
        print(f"a directory of {', '.join(f.name for f in r.files)}")
    elif len(r.files) > 1:
        print(f"written together (keep them side by side): {', '.join(str(f) for f in r.files)}")
    return 0


def cmd_embed(args) -> int:
    e = _load_run(args.run_dir, "cpu").embed(args.text)
    for row in e.tolist():
        print(json.dumps([round(v, 6) for v in row]))
    if len(args.text) > 1:
        print(json.dumps({"cosine": [[round(v, 4) for v in r] for r in (e @ e.T).tolist()]}))
    return 0


COMMANDS = {"embed": cmd_embed, "export": cmd_export, "import": cmd_import,
            "list": cmd_list, "train": cmd_train, "generate": cmd_generate, "eval": cmd_eval, "demo": cmd_demo,
            "viz": cmd_viz, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    quiet = args.quiet or os.environ.get("RANK", "0") != "0"  # under torchrun only rank 0 talks
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(message)s", stream=sys.stderr)
    from .errors import TokennetError

    try:
        return COMMANDS[args.command](args)
    except (CLIError, TokennetError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"tokennet: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # the disk, permissions, a missing file: the user's to fix, not a bug
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"tokennet: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tokennet: interrupted", file=sys.stderr)
        return 130
    except Exception:
        print("tokennet: internal error (a bug): please report it with the traceback below and the command "
              "that caused it", file=sys.stderr)
        raise

if __name__ == "__main__":
    sys.exit(main())
