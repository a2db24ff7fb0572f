"""The ``tokennet`` command: parses arguments, calls the library, prints.

Expected failures (bad input, missing files, a run directory in the way) print one line
``tokennet: error: ...`` and exit with status 2; an interrupted run exits with 130 after saving a
checkpoint. Nothing here branches on a task or model family: ``generate`` and ``viz`` take the flags every
registered task declares (:mod:`tokennet.tasks`) and hand a run's values to its task.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path

from .errors import did_you_mean
from .tasks.heads_command import add_heads_parser, heads_command
from .tasks.probe_command import add_probe_parser, probe_command
from .viz.explore.command import add_explore_parser, explore_command

__all__ = ["main", "build_parser"]

EPILOG = """examples:
  tokennet train gpt-char                    # a character GPT on Tiny Shakespeare (embedded), prints a sample
  tokennet train gpt --data notes.txt --max-iters 2000
  tokennet generate runs/gpt-char --prompt "ROMEO:" --max-new-tokens 200
  tokennet eval runs/gpt-char
  tokennet train vit                         # ViT on 8x8 digits, next to an RBF SVM
  tokennet examples runs/vit --out examples-vit   # held-out digits as PNG files, with their labels
  tokennet generate runs/vit --input examples-vit/image-0.png
  tokennet viz runs/vit --index 3            # attention maps, rollout, position similarity (PNG)
  tokennet --plugin my_task.py train my-task # a task of your own, in a file (see examples/)
  tokennet list
"""


class CLIError(Exception):
    """An expected failure: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other tokennet error), exit status 2, and names the
    closest flags or choices to a mistyped one ("did you mean '--max-iters'?")."""

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # a subcommand's unknown flags reach the top parser: suggest from that subcommand's own flags
            command = _subcommand(self, getattr(parsed, "command", None)) or self
            hints = [did_you_mean(extra.split("=", 1)[0], command._option_string_actions)
                     for extra in extras if extra.startswith("-")]
            hint = next(filter(None, hints), "")
            command.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; {hint}" if hint else ""))
        return parsed

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice and (hint := did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))):
            message = message[:choice.start()] + f"invalid choice: {choice.group(1)!r}; {hint}"
        self.exit(2, f"tokennet: error: {message} (see `{self.prog} --help`)\n")


def _subcommand(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser | None:
    """The parser of subcommand ``name`` under ``parser`` (None when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def _declared():
    """Every registered task's declared inputs, generation options and viz options (one entry per flag)."""
    from .plugins import list_tasks

    inputs, options, viz = {}, {}, {}
    for task in list_tasks().values():
        for i in task.inputs:
            inputs.setdefault(i.name, i)
        for option in task.options:
            options.setdefault(option.name, option)
        for option in task.viz_options:
            viz.setdefault(option.name, option)
    return inputs, options, viz


def _add_option(p, o) -> None:
    if o.flag:
        p.add_argument(o.cli, dest=o.name, action="store_const", const=True, default=None, help=o.help)
    else:
        p.add_argument(o.cli, dest=o.name, type=o.type, default=None, choices=o.choices, metavar=o.metavar,
                       help=o.help)


def _add_train(sub) -> None:
    cmd = sub.add_parser(
        "train",
        help="train a recipe into a run directory",
        description="Train RECIPE (see `tokennet list`) and write a run directory: config.json, "
        "model.safetensors, tokenizer.json (text), metrics.json, log.jsonl, run.json, checkpoints/.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings: any model config field, trainer field or recipe option, e.g.\n"
        "  --set dim=256 num_layers=6 lr=3e-4 batch_size=64 tokenizer=char precision=bf16\n"
        "`tokennet train RECIPE --show-settings` lists them with their defaults.",
    )
    cmd.add_argument("recipe", help="recipe name, e.g. gpt, gpt-char")
    cmd.add_argument("--data", help="the recipe's data: an embedded dataset's name or a path (text recipes: "
                     "shakespeare, python-docs, a file, directory or glob; vit: digits, fashion-mnist, mnist1d, ...; "
                     "default: the recipe's own)")
    cmd.add_argument("--out", help="run directory (default: runs/RECIPE)")
    cmd.add_argument("--max-iters", type=int,
                     help="optimizer steps; given alone, it replaces the recipe's default time budget")
    cmd.add_argument("--time-budget", type=float, metavar="SEC",
                     help="the whole run in SEC seconds, from the command's start: data preparation (clips "
                     "synthesized, a tokenizer trained, caching), training, the final evaluation and the report "
                     "(a resumed run's earlier sessions count too); training stops early enough for what follows it "
                     "to fit, and the learning-rate schedule follows the clock. A budget that cannot hold the data's "
                     "preparation is refused at the start, with the preparation's measured time")
    cmd.add_argument("--seed", type=int, help="random seed (data order, init, dropout)")
    cmd.add_argument("--init", metavar="SOURCE",
                     help="fine-tune: start from these weights instead of a fresh model — a tokennet run, or anything "
                     "`tokennet import` reads (a Hugging Face directory, a .gguf file), converted on the fly; text "
                     "recipes then read the data with the source's own tokenizer (and a --data chats.jsonl of "
                     '{"messages": [...]} records through its chat template, the loss on the replies only). '
                     "--set lora_rank=R trains LoRA adapters instead of every weight (lora_alpha, lora_dropout, "
                     "lora_targets=attn,mlp, lora_save=merged|adapter, lora_modules_to_save=MODULES trained in full "
                     "beside them; a classifier's new head always is); as for any training, --set compile=true "
                     "compiles the step (torch.compile) and --set checkpointing=true recomputes each block's forward "
                     "in backward (less memory, the same losses)")
    cmd.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N, mps")
    cmd.add_argument("--set", dest="sets", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                     help="override settings (repeatable: --set a=1 --set b=2 sets both; a key given twice takes "
                     "the last value)")
    exclusive = cmd.add_mutually_exclusive_group()
    exclusive.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    exclusive.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    cmd.add_argument("--show-settings", action="store_true",
                     help="print the settings a new run would use — the recipe's defaults (for the --data given, "
                     "where the recipe has per-dataset profiles) with --set, --max-iters, --time-budget and --seed "
                     "applied —, grouped (model, training, data, the recipe's own) with a description each, and exit "
                     "(with --json: one JSON object of name → value)")
    cmd.add_argument("--no-progress", action="store_true", help="no progress bar (a line every ~10 s instead; also "
                     "what a log file gets)")
    cmd.add_argument("--json", action="store_true", help="print metrics.json's content at the end instead of the "
                     "short summary (with --show-settings: the settings as JSON)")


def _add_eval(sub) -> None:
    cmd = sub.add_parser("eval", help="evaluate a run and print its metrics as JSON",
                         description="Evaluate a trained run on its own held-out split, or on --data. An "
                         "imported language model (`tokennet import`) has no split of its own: --data FILE is "
                         "required, and its next-token loss and perplexity on that text file are printed "
                         "(non-overlapping windows of up to 1,024 tokens, at most 262,144 tokens read), with bits "
                         "per byte (comparable across tokenizers). --stride S: sliding-window perplexity on --data, "
                         "for any language-model run (each window starts S tokens after the last, so every token is "
                         "predicted from at least window - S tokens before it).")
    cmd.add_argument("run_dir")
    cmd.add_argument("--data", help="evaluate on this data instead of the run's validation split")
    cmd.add_argument("--stride", type=int, default=None, metavar="S",
                     help="sliding-window perplexity and bits per byte on the text file --data: windows of "
                     "min(1024, context) tokens every S tokens (S = the window: non-overlapping)")
    cmd.add_argument("--device", default="auto")


def _add_demo(sub) -> None:
    from .demos import list_demos

    demos = list_demos()
    cmd = sub.add_parser("demo", help="small demonstrations from the lecture",
                         description=" ".join(f"{demo.name}: {demo.description}." for demo in demos))
    cmd.add_argument("name", choices=[demo.name for demo in demos])
    cmd.add_argument("--out", default=None, help="output directory (default: runs/NAME); refused if it exists")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--only", metavar="PART", help="run one part of a demo made of parts (claims: one claim)")
    cmd.add_argument("--list", action="store_true", help="list the demo's parts (claims: the claims) and exit")
    cmd.add_argument("--overwrite", action="store_true", help="write into an output directory that exists")


def _add_report(sub) -> None:
    cmd = sub.add_parser(
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
    cmd.add_argument("run_dir", help="a run directory from `tokennet train` (finished, running or interrupted)")
    cmd.add_argument("--out", metavar="FILE", help="where to write the page (default: RUN_DIR/report.html)")
    cmd.add_argument("--device", default="cpu", help="where to run the model for samples and predictions "
                     "(cpu by default; auto, cuda, ...)")


def _add_embed(sub) -> None:
    cmd = sub.add_parser(
        "embed",
        help="sentence embeddings of texts from a text-encoder run (e.g. imported all-MiniLM-L6-v2)",
        description="Print one JSON list per --text: the sentence embedding as the model defines it (mean of "
        "the token states over the real tokens, L2-normalized), and, with two or more texts, their cosine "
        "similarities. Texts longer than the model's context are truncated (a warning on stderr says so).",
    )
    cmd.add_argument("run_dir", help="a text-encoder run (tokennet import of a BertModel directory)")
    cmd.add_argument("--text", action="append", required=True, help="a text to embed (repeat for several)")


def _add_export(sub) -> None:
    cmd = sub.add_parser(
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
    cmd.add_argument("run_dir", help="a run directory (trained or imported)")
    cmd.add_argument("--format", required=True, choices=["onnx", "pt2", "gguf", "hf"],
                     help="onnx (torch.onnx.export with dynamo=True; needs onnx, onnxscript, onnxruntime), pt2 "
                     "(torch.export.save), gguf (needs the gguf package) or hf")
    cmd.add_argument("--out", required=True, help="the file to write (a directory for --format hf), e.g. model.onnx")
    cmd.add_argument("--overwrite", action="store_true",
                     help="replace --out if it exists (otherwise it is refused): only a previous export of the same "
                     "format (hf: a directory with config.json naming a model_type and model.safetensors; gguf: a GGUF "
                     "file; pt2: a torch.export archive; onnx: an ONNX model and its .data), never the run itself or a "
                     "path inside it; the new export is checked before the old one is replaced")
    cmd.add_argument("--gguf-type", choices=["f32", "f16", "q8_0"], default="f16",
                     help="GGUF: the type of the matrices (default f16, as llama.cpp's converter); vectors and norms "
                     "stay f32, and weights the run holds in GGUF blocks (an imported file's) are written as they are")
    cmd.add_argument("--tolerance", type=float, default=None,
                     help="replace the default check (every output within 1e-4·max|output| + 1e-4·|output| of the "
                     "run's, like torch.testing.assert_close scaled to the outputs) by an absolute limit on "
                     "max |exported − PyTorch|")


def _add_generate(sub, declared) -> None:
    inputs, options, _ = declared
    cmd = sub.add_parser(
        "generate",
        help="use a run: continue text, translate, caption, classify, answer ... (whatever its task does)",
        description="Use a trained or imported run on new inputs; what it takes and prints is its task's "
        "(tokennet.tasks). Language models: continue --prompt, streaming tokens as they come, over a KV cache; "
        "past the model's context the model sees a sliding window, and a prompt longer than the context is cut "
        "to its last window (a note on stderr says so). Translation runs: translate --prompt with beam search. "
        "Captioning runs: caption the --image files. Image classifiers: print each --image file's class index "
        "and probability. Audio classifiers: each --audio file's class index, name and probability. Graph runs: "
        "each graph of a --graphs JSON file. --input FILE ... is the run's first file input, whatever it is "
        "called. A flag the run's task does not take is refused in one line. " + _output_formats(),
    )
    cmd.add_argument("run_dir", help="a run directory from `tokennet train` or `tokennet import`")
    cmd.add_argument("--input", nargs="+", action="extend", metavar="FILE",
                     help="the run's input files (its task's first file input: --image, --audio, --graphs, ...)")
    for i in inputs.values():
        if i.file:
            cmd.add_argument(i.flag, dest=i.name, nargs="+", action="extend", metavar="FILE", default=None,
                             help=i.help)
        else:
            cmd.add_argument(i.flag, dest=i.name, default=None, metavar=i.name.upper(), help=i.help)
    for option in options.values():
        _add_option(cmd, option)
    cmd.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    cmd.add_argument("--json", action="store_true", help="a run whose output is a table (classes, graph "
                     "predictions): each line as a JSON object of the table's fields instead (one a line)")


def _output_formats() -> str:
    """What each task that prints a table prints, from the tasks' own declarations (``Task.columns``)."""
    from .plugins import list_tasks

    tables = {task.name: task.columns for task in list_tasks().values() if task.columns}
    if not tables:
        return ""
    listed = "; ".join(f"{name}: {', '.join(columns)}" for name, columns in tables.items())
    return (f"Tables are printed as tab-separated lines, one per input, without a header: {listed} (a graph "
            "regression: graph, then its predicted values); --json prints each line as a JSON object of those fields.")


def _add_examples(sub) -> None:
    cmd = sub.add_parser(
        "examples",
        help="write a few held-out inputs of a run as files to try it on (pictures, clips, graphs, prompts)",
        description="Write the first --count held-out examples of the run's own data into --out, as files its "
        "`tokennet generate` takes: pictures as PNG (a 1-D model's signals as .npy), a question-answering run's "
        "scenes as PNG with their questions and answers beside them (scene-K.json), audio clips as WAV, graphs as "
        "the JSON --graphs reads (one graph a file), prompts and source texts as .txt; a multimodal run's in one "
        "folder per task. The names are stable (image-0.png, clip-0.wav, graph-0.json, scene-0.png, "
        "prompt-0.txt, ...). --out/examples.json indexes them: each example's files, its generate flags and its "
        "label (the answer the held-out data gives). Prints each file with its label, then a generate command to "
        "try. --out must be new, empty, or a directory tokennet examples wrote (replaced whole); nothing is "
        "written when the command is refused.",
        epilog="example: tokennet examples runs/vit --out examples-vit && "
        "tokennet generate runs/vit --image examples-vit/image-0.png",
    )
    cmd.add_argument("run_dir", help="a run directory from `tokennet train`")
    cmd.add_argument("--out", required=True, metavar="DIR", help="the directory to write the examples into")
    cmd.add_argument("--count", type=int, default=None, metavar="N",
                     help="how many held-out examples, 1 to 1000 (refused where the held-out data has fewer; a "
                     "multimodal run: N per task). Default: 3, or all of them where there are fewer")


def _add_viz(sub, declared) -> None:
    cmd = sub.add_parser(
        "viz",
        help="draw a trained model's attention (PNG)",
        description="Draw the pictures a run's task declares. Language models: token-to-token causal attention "
        "over --text, per layer and head. ViT: where one patch looks (per layer and head, over a test image or "
        "--image), the <cls> token's attention rollout, and the similarity of the position embeddings. "
        "Translation: the cross-attention alignment of a test example or --text. Captioning: each generated "
        "word's attention over the image patches. Audio: the spectrogram with the attention rollout. Graphs: the "
        "attention of one node (--patch) over a test graph (--index), and its Laplacian positions. Spheres: one "
        "patch's attention over the sphere. Imported text encoders: bidirectional token attention over --text. "
        "Attention is recomputed with the plain formula, so runs trained with the fused backend work.",
    )
    cmd.add_argument("run_dir", help="a run directory from `tokennet train`")
    cmd.add_argument("--out", help="output directory (default: RUN_DIR/viz)")
    cmd.add_argument("--index", type=int, help="which test example to draw (default 0)")
    cmd.add_argument("--patch", type=int, help="the query patch (or node), row-major (default: the centre patch)")
    cmd.add_argument("--layer", type=int, help="only this layer (default: all)")
    cmd.add_argument("--head", type=int, help="only this head (default: all, and their mean)")
    cmd.add_argument("--data", help="the data to draw from (default: the run's)")
    cmd.add_argument("--text", help="language models and text encoders: the text whose attention to draw (default: a "
                     "fixed sentence); translation runs: draw the alignment of this source instead of a test example")
    cmd.add_argument("--image", metavar="PATH", help="captioning and image runs: draw this image file (the model's "
                     "size) instead of a test image")
    cmd.add_argument("--audio", metavar="FILE", help="audio classification runs: draw this audio file instead of a "
                     "test clip")
    for option in declared[2].values():
        if option.cli not in cmd._option_string_actions:
            _add_option(cmd, option)
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def _add_import(sub) -> None:
    cmd = sub.add_parser(
        "import",
        help="convert a foreign checkpoint (Hugging Face GPT-2, Llama, BERT, ViT; a GGUF file) into a run directory",
        description="Convert the checkpoint in SOURCE onto tokennet's own modules and write an ordinary run "
        "directory (config.json, model.safetensors, tokenizer.json, run.json) that `generate`, `viz`, `eval "
        "--data`, `export` and tokennet.load use without transformers. SOURCE is a Hugging Face directory "
        "(config.json + model.safetensors) of GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or "
        "Qwen2ForCausalLM (→ gpt: its tokenizer.json, "
        "or GPT-2's vocab.json + merges.txt, and its chat template come along), BertModel (→ text-encoder, with "
        "its tokenizer: `tokennet embed`), ViTForImageClassification (→ vit; image preprocessors are not "
        "imported), or a .gguf file of the llama, gpt2, qwen2 or gemma3 architecture (Gemma 3: a gpt configuration "
        "with its SentencePiece vocabulary; Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K tensors kept as "
        "blocks, other types dequantized with a note; llama.cpp's Q/K permutation undone, the tokenizer and chat "
        "template from the file's metadata). Every config field and every tensor "
        "must be accounted for: an unknown field, an unused or missing tensor stops the import with one line, "
        "and nothing is written.",
    )
    cmd.add_argument("source", help="a Hugging Face checkpoint directory or a .gguf file")
    cmd.add_argument("--out", required=True, help="the new run directory (must not exist, or be empty)")
    cmd.add_argument("--overwrite", action="store_true",
                     help="replace the run in --out (only a directory whose run.json reads as a tokennet run; the new "
                     "run is written beside it and swapped in once whole, so a failure leaves the old one as it was)")


def _add_serve(sub) -> None:
    cmd = sub.add_parser(
        "serve",
        help="serve a language-model run over HTTP in the OpenAI format (completions, chat, streaming)",
        description="An OpenAI-compatible server for RUN_DIR (trained or imported): POST /v1/completions and "
        "/v1/chat/completions (stream: true as server-sent events; logprobs, echo, response_format JSON "
        "schemas by constrained decoding, tools where the chat template takes them), GET /v1/models, GET "
        "/health; POST /v1/embeddings for a text-embedding run. Concurrent "
        "requests decode together, one batched step for all of them, joining and leaving between steps. Chat "
        "prompts use the run's chat template (plain ChatML for a tokenizer without one). Ctrl-C lets the "
        "requests in flight finish, then exits. Needs the serve extra: pip install 'tokennet[serve]'.",
    )
    cmd.add_argument("run_dir", help="a language-model run directory (trained, or imported with tokennet import)")
    cmd.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    cmd.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    cmd.add_argument("--api-key", default=None,
                     help="require 'Authorization: Bearer KEY' on every /v1 request. Default: the environment "
                     "variable TOKENNET_API_KEY (preferred: a flag is visible to every user in ps); --api-key wins "
                     "when both are set; neither: no key. An empty key is refused")
    cmd.add_argument("--model-name", action="append", default=None, metavar="NAME",
                     help="a model id clients may ask for; repeat it for aliases (default: the run's directory "
                     "name). Another name is a 404 that names these")
    cmd.add_argument("--any-model-name", action="store_true",
                     help="accept whatever model name a client sends (e.g. a client's default 'gpt-3.5-turbo')")
    cmd.add_argument("--max-batch", type=int, default=16, help="the most requests decoded together (default 16)")
    cmd.add_argument("--context", type=int, default=None,
                     help="the longest prompt + reply served, in tokens (default: the model's context; more than "
                     "the model's context is refused)")
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    cmd.add_argument("--quantize", default="auto", choices=["auto", "none", "bf16", "int8", "int4"],
                     help="decode with a low-precision copy of the weights, as generate --quantize does. Default "
                     "auto: the fastest copy that keeps quality: on the CPU, int4 for a GGUF run whose linear layers "
                     "all hold Q8_0/Q4_0/Q4_1 blocks where the CPU has AVX-512 VNNI (the file's own blocks × int8 "
                     "activations by integer dot products), else int8 per-channel (other runs' blocks requantized); "
                     "none (float32) elsewhere; the start log and GET /health say which")
    cmd.add_argument("--no-compile", action="store_true",
                     help="decode eagerly. Default: the batched decoding step compiled by torch.compile (as generate), "
                     "compiled before the first request; the first start on a machine pays for it (minutes for a "
                     "135M model), later starts load it from Inductor's on-disk cache (~/.cache/tokennet/inductor). "
                     "Where it "
                     "does not compile it says so once and decodes eagerly; TOKENNET_COMPILE=0 also turns it off. "
                     "The start log and GET /health (compile) say which")
    cmd.add_argument("--threads", type=int, default=None,
                     help="CPU threads a decoding step uses. Default: all but one of torch's (OMP_NUM_THREADS, else "
                     "the cores), at least 1: the core left over runs the HTTP server and its clients, which a step "
                     "using every core waits for at each of its parallel regions. GET /health says how many")
    cmd.add_argument("--prefix-cache-mb", type=float, default=256.0,
                     help="MiB of keys and values kept for prompt prefixes that requests share (a system prompt, "
                     "few-shot examples, a chat's earlier turns), so their next requests compute only what "
                     "follows; least recently used blocks of 16 tokens are evicted (default 256; 0 = off; more "
                     "than the free memory is refused)")
    cmd.add_argument("--max-queue", type=int, default=256,
                     help="the most sequences (one per prompt) waiting for a decoding row; beyond it a request is "
                     "answered 429 rate_limit_error (default 256). Requests also hold at most 2,048 prompts and "
                     "8 MiB of body")
    cmd.add_argument("--speculative", default="off", choices=["off", "ngram", "draft"],
                     help="speculative decoding of the requests that do not choose theirs (a request's "
                     "\"speculative\" field does), lossless as generate --speculative: greedy text is plain "
                     "decoding's, sampled text is distributed as plain sampling's. ngram drafts from each request's "
                     "prompt and text so far; draft from --draft RUN. Drafting requests verify their drafts in the "
                     "batch's one forward (eager: the compiled step serves the steps without drafts), in the steps "
                     "where the drafts' expected accepted tokens repay that forward's measured cost for the whole "
                     "batch. GET /health says the mode and the acceptance rate (default off)")
    cmd.add_argument("--draft", default=None, metavar="RUN",
                     help="the draft run for --speculative draft (implies it): a smaller language-model run with the "
                     "same tokenizer (another tokenizer is refused, naming both runs)")
    cmd.add_argument("--draft-tokens", type=int, default=8, metavar="K",
                     help="the most tokens drafted a round, 1 to the context − 1 (default 8; the number drafted "
                     "adapts below it per request; a request's \"draft_tokens\" field sets its own)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokennet",
        description="tokennet: turn any data into tokens, then one generic transformer processes the tokens.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"tokennet {_version()}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                        help="import a plugin file first: its tasks, recipes and models work with every command "
                        "(repeatable; installed packages register through the entry-point group tokennet.plugins)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("list", help="list models, recipes and tasks",
                   description="List registered models, recipes and tasks (with the plugins loaded).")
    declared = _declared()
    _add_train(sub)
    _add_generate(sub, declared)
    _add_examples(sub)
    _add_eval(sub)
    _add_demo(sub)
    _add_viz(sub, declared)
    _add_report(sub)
    _add_import(sub)
    _add_export(sub)
    _add_embed(sub)
    _add_serve(sub)
    add_explore_parser(sub)
    add_heads_parser(sub)
    add_probe_parser(sub)
    _add_lm_eval(sub)
    return parser


def _add_lm_eval(sub) -> None:
    sub.add_parser("lm-eval", add_help=False, help="EleutherAI's evaluation harness with the tokennet model registered",
                   description="tokennet lm-eval ARGS...: lm-eval's own command line (pip install lm-eval) with "
                   "`--model tokennet --model_args run=DIR` available; every argument goes to lm-eval unchanged, "
                   "e.g. `tokennet lm-eval --model tokennet --model_args run=runs/gpt --tasks shakespeare_mc "
                   "--include_path bench/lm_eval`. (lm-eval's own `lm-eval` command cannot find tokennet's model: "
                   "it has no plugin discovery.)")


def cmd_lm_eval(argv: list[str]) -> int:
    """Every argument to lm-eval's command line, after importing tokennet's lm-eval model (which registers it)."""
    try:
        from .interop.lm_eval import main as lm_eval_main
    except ImportError as error:
        raise CLIError(f"tokennet lm-eval needs the evaluation harness: pip install lm-eval ({error})") from None
    return lm_eval_main(argv)


def _version() -> str:
    from . import __version__

    return __version__


def cmd_list(args) -> int:
    from .models.registry import list_models, preset_info
    from .plugins import list_tasks, loaded
    from .recipes import list_recipes

    print("models:  (presets, as create_model builds them; a recipe trains its own size, below)")
    for name in list_models():
        print(f"  {name:<18} {preset_info(name)[2]}")
    print("recipes:  (what each trains by default; `tokennet train RECIPE --show-settings` lists every setting)")
    for recipe in list_recipes():
        print(f"  {recipe.name:<18} {recipe.description}\n  {'':<18} trains {_model_size(recipe)}")
    print("tasks (model family: task, verbs):")
    for family, t in list_tasks().items():
        print(f"  {family:<18} {t.name}: {', '.join(sorted(t.verbs)) or '-'}")
    if loaded():
        print("plugins:")
        for plugin in loaded():
            print(f"  {plugin}")
    return 0


def _model_size(recipe) -> str:
    """The model a recipe trains with its default data and settings: ``the gpt model at 4 layers × 128 wide, 4
    heads`` (not the preset's own size, which ``tokennet list`` prints under models)."""
    settings = recipe.defaults()
    size = ""
    if "dim" in settings and "num_layers" in settings:
        decoder = settings.get("num_decoder_layers")
        size = (f"{settings['num_layers']}{f' + {decoder}' if decoder else ''} layers × {settings['dim']} wide"
                + (f", {settings['num_heads']} heads" if "num_heads" in settings else ""))
    elif "widths" in settings:  # a CNN: its stages' widths
        size = f"stages {'/'.join(map(str, settings['widths']))}"
    return f"the {recipe.model} model at {size}" if size else f"the {recipe.model} model"


def _summary(recipe: str, run_dir: Path, metrics: dict, report_next: bool = False) -> str:
    """The end of `tokennet train`: where training stopped (the last progress line's step and seconds), the
    recipe's headline metrics as a table beside its baselines, the sample, where the run and report are
    (``report_next``: the page is written right after this is printed). See :mod:`tokennet.lifecycle.summary`."""
    from .lifecycle.summary import summary
    from .recipes import get_recipe
    from .run import read_run_info

    budget = read_run_info(run_dir).get("settings", {}).get("time_budget")
    return summary(get_recipe(recipe), run_dir, metrics, report_next=report_next, time_budget=budget)


def cmd_train(args) -> int:
    from .lifecycle import resolve_settings
    from .lifecycle.settings import show_settings
    from .recipes import get_recipe, parse_sets, train

    recipe = get_recipe(args.recipe)
    defaults = recipe.defaults(args.data)  # the dataset's profile, where the recipe has one
    sets = parse_sets(args.sets, defaults, recipe.setting_types(), recipe=recipe.name)
    for flag, key in (("max_iters", "max_iters"), ("time_budget", "time_budget"), ("seed", "seed")):
        v = getattr(args, flag)
        if v is not None:
            if key in sets and sets[key] != v:
                raise CLIError(f"--{flag.replace('_', '-')} {v} conflicts with --set {key}={sets[key]}")
            sets[key] = v
    if args.show_settings:  # as a new run resolves them, grouped by where each is declared, with its description
        shown = resolve_settings(recipe, defaults, None, sets)
        print(json.dumps(shown, indent=2, sort_keys=True) if args.json else "\n".join(show_settings(recipe, shown)))
        return 0
    if args.no_progress or not sys.stderr.isatty():
        sets.setdefault("progress", False)  # a log file gets plain progress lines instead of a bar
    out = Path(args.out) if args.out else Path("runs") / recipe.name
    shown = []

    def show(run_dir: Path, metrics: dict, report: bool) -> None:  # before the report is drawn: the sample now
        if os.environ.get("RANK", "0") == "0" and not args.json:
            print(_summary(recipe.name, run_dir, metrics, report_next=report), flush=True)
            shown.append(run_dir)

    try:
        run_dir, metrics = train(recipe.name, data=args.data, out=out, sets=sets, device=args.device,
                                 resume=args.resume, overwrite=args.overwrite, init=args.init, on_metrics=show,
                                 started=getattr(args, "started", None))
    except KeyboardInterrupt:
        print(f"tokennet: interrupted; a checkpoint is in {out / 'checkpoints'}; "
              f"continue with: tokennet train {recipe.name} --out {out} --resume", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") != "0" or shown:  # under torchrun only rank 0 prints; shown: printed already
        return 0
    print(json.dumps(metrics, indent=2) if args.json else _summary(recipe.name, run_dir, metrics))
    return 0


def _load_run(run_dir: str, device: str = "cpu"):
    from .run import load

    return load(run_dir, device=device)


def _check_option(o, value) -> None:
    """The CLI's range checks of shared options (the library checks them again, in its own words)."""
    if value is None or o.flag or o.choices:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise CLIError(f"{o.cli} must be a finite number, got {value}")
    if o.name in ("max_new_tokens", "beam_size", "top_k", "draft_tokens") and value < 1:
        raise CLIError(f"{o.cli} must be >= 1, got {value}")


def cmd_generate(args) -> int:
    """Hand the run's task the values of the flags it declares; refuse, in one line, any flag it does not take."""
    from .device import resolve_device
    from .tasks.base import check_values
    from .tasks.example_files import examples_command

    inputs, options, _ = _declared()
    given = {n: getattr(args, n) for n in (*inputs, *options) if getattr(args, n, None) is not None}
    for n, v in given.items():
        if n in options:
            _check_option(options[n], v)
    run = _load_run(args.run_dir, resolve_device(args.device))
    task = run.task
    takes = [*(i.flag for i in task.inputs), *(option.cli for option in task.options)]
    if args.input:
        files = [i for i in task.inputs if i.file]
        if not files:
            raise CLIError(f"--input: {args.run_dir} is {task.a_name} run, which takes no input files "
                           f"(it takes: {', '.join(takes) or 'nothing'})")
        if files[0].name in given:
            raise CLIError(f"--input and {files[0].flag} name the same input; give one of them")
        given[files[0].name] = args.input
    mine = {i.name for i in task.inputs} | {option.name for option in task.options}
    for n in given:
        if n not in mine:
            flag = (inputs[n].flag if n in inputs else options[n].cli)
            raise CLIError(f"{flag} does not apply to {args.run_dir}, {task.a_name} run (it takes: "
                           f"{', '.join(takes) or 'nothing'})")
    if not task.declares("respond"):
        raise CLIError(f"{args.run_dir} is {task.a_name} run: it has nothing to generate")
    values = {i.name: given.get(i.name, i.default) for i in task.inputs}
    values.update({option.name: given.get(option.name, option.default) for option in task.options})
    try:
        check_values(task, values)
    except ValueError as error:
        hint = f" (held-out inputs to try: {examples_command(args.run_dir)})" if task.declares("examples") else ""
        raise CLIError(f"{args.run_dir} is {task.a_name} run: {str(error).split(': ', 1)[1]}{hint}") from None
    columns = task.table_columns(run) if args.json else ()
    if args.json and not columns:
        raise CLIError(f"--json: {args.run_dir} prints text, not a table ({task.name})")
    with _notes_between_lines() as wrote:
        for piece in task.respond(run, values):
            if columns:  # the machine form: each tab-separated line as an object of the task's fields
                for line in piece.splitlines():
                    print(json.dumps(_table_record(columns, line)), flush=True)
                continue
            sys.stdout.write(piece)
            sys.stdout.flush()
            wrote(piece)
    return 0


@contextlib.contextmanager
def _notes_between_lines():
    """Hold the log's notes (stderr) while stdout is in the middle of a line, and write them once it ends: a
    note never lands inside the generated text when both go to one terminal. Yields ``wrote(piece)``, to be called
    with each piece written to stdout."""
    handlers = [handler for handler in logging.getLogger().handlers if isinstance(handler, _StderrHandler)]
    held: list[logging.LogRecord] = []
    mid_line = False

    def hold(record: logging.LogRecord) -> bool:
        if mid_line:
            held.append(record)
        return not mid_line

    def wrote(piece: str) -> None:
        nonlocal mid_line
        if piece:
            mid_line = not piece.endswith("\n")
        if not mid_line:
            release()

    def release() -> None:
        while held:
            record = held.pop(0)
            for handler in handlers:
                handler.handle(record)

    for handler in handlers:
        handler.addFilter(hold)
    try:
        yield wrote
    finally:
        mid_line = False
        for handler in handlers:
            handler.removeFilter(hold)
        if held:
            sys.stdout.flush()
            print(file=sys.stderr)  # the text's line is unfinished (an error, or output without a last newline)
            release()


def _table_record(columns: tuple[str, ...], line: str) -> dict:
    """One tab-separated line of a task's table as ``{field: value}``, numbers as numbers."""
    def value(field: str):
        for kind in (int, float):
            try:
                return kind(field)
            except ValueError:
                pass
        return field

    return dict(zip(columns, map(value, line.split("\t")), strict=True))


def _asked(example, inputs) -> str:
    """An example's text inputs (a prompt, a question) as the table shows them, quoted, before its label."""
    texts = [json.dumps(example.values[i.name], ensure_ascii=False) for i in inputs
             if not i.file and isinstance(example.values.get(i.name), str)]
    return "".join(f"{text} " for text in texts)


def cmd_examples(args) -> int:
    """Write the run's held-out examples; print each with its label, then a generate command to try."""
    from .tasks.example_files import DEFAULT_COUNT, INDEX_FILE, check_request, generate_command

    check_request(args.out, DEFAULT_COUNT if args.count is None else args.count)  # before loading the run
    run = _load_run(args.run_dir)
    written = run.write_examples(args.out, args.count)
    inputs = run.task.inputs
    shown = [(" ".join(str(path) for path in example.files), _asked(example, inputs), example.label)
             for example in written]
    width = max(len(files) for files, _, _ in shown)
    print(f"{len(written)} held-out example{'s' * (len(written) != 1)} of {args.run_dir} ({run.task.name}), "
          "each with the answer its data gives:")
    for files, asked, label in shown:
        print(f"  {files:<{width}}  {asked}→ {' '.join(label.split())}")
    print(f"  {Path(args.out) / INDEX_FILE}: the index (each example's files, generate flags and label)")
    print(f"try: {generate_command(args.run_dir, written[0], inputs)}")
    return 0


def cmd_eval(args) -> int:
    from .device import resolve_device
    from .errors import RecipeError
    from .recipes import get_recipe

    run = _load_run(args.run_dir, resolve_device(args.device))
    if args.stride is not None:  # a sliding window over a text file: any language-model run, trained or imported
        if args.data is None:
            raise CLIError("--stride needs --data FILE: the text file to slide the window over")
        if not hasattr(run.task, "evaluate_text"):
            raise CLIError(f"--stride applies to language-model runs; {args.run_dir} is {run.task.a_name} run")
        print(json.dumps(run.task.evaluate(run, args.data, stride=args.stride), indent=2))
        return 0
    recipe = None
    if run.recipe not in (None, "import"):
        try:
            recipe = get_recipe(run.recipe)
        except RecipeError:
            raise CLIError(f"{args.run_dir} was trained by recipe {run.recipe!r}, which is not registered here "
                           "(load its plugin with --plugin FILE)") from None
    if recipe is not None and recipe.evaluate_run is not None:
        from .progress import phase

        with phase(f"evaluating {args.run_dir}"):  # seconds to a minute (audio's robustness sets): shown
            metrics = recipe.evaluate_run(run, args.data)
    elif run.recipe is None:
        raise CLIError(f"{args.run_dir} is a saved model without run.json: no recipe to evaluate it with")
    else:  # an imported checkpoint has no split of its own: its task evaluates it on --data
        if args.data is None:
            raise CLIError(f"{args.run_dir} is an imported checkpoint with no held-out split of its own: "
                           "give --data FILE (a text file) to measure its loss and perplexity on")
        metrics = run.task.evaluate(run, args.data)
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_viz(args) -> int:
    from .device import resolve_device
    from .viz import visualize

    # The viz options go to the task's pictures; one they do not read is refused before anything is written.
    options = {k: v for k, v in vars(args).items() if k not in ("command", "quiet", "run_dir", "out", "device",
                                                                "plugin")}
    run = _load_run(args.run_dir, str(resolve_device(args.device)))
    takes = run.task.viz_takes(run)
    for name in (name for name, value in options.items() if value is not None and name not in takes):
        flags = ", ".join(sorted("--" + n.replace("_", "-") for n in takes)) or "no flags"
        raise CLIError(f"--{name.replace('_', '-')} does not apply to {args.run_dir}, {run.task.a_name} run (its "
                       f"pictures take: {flags})")
    for path in visualize(run, args.out, **options):
        print(path)
    return 0


def cmd_import(args) -> int:
    from .interop import import_checkpoint
    from .models.registry import parameter_count

    imported = import_checkpoint(args.source, args.out, overwrite=args.overwrite)
    print(f"{imported.path}: {imported.converter} → tokennet {imported.model.config.family} "
          f"({parameter_count(imported.model):,} parameters)")
    return 0


def cmd_demo(args) -> int:
    from .demos import get_demo
    from .errors import TokennetError

    demo = get_demo(args.name)
    parts = demo.parts() if demo.parts else None
    if args.list:
        print("\n".join(parts) if parts else f"{demo.name} has no parts: run it whole")
        return 0
    if args.only is not None and (parts is None or args.only not in parts):
        what = f"{demo.name}: {', '.join(parts)}" if parts else f"{demo.name} has no parts"
        raise TokennetError(f"unknown --only {args.only!r}; {what}")
    out = Path(args.out or f"runs/{args.name}")
    if out.exists() and not args.overwrite:
        raise TokennetError(f"{out} exists; pass --overwrite to write into it, or choose another --out")
    metrics = demo.run(out, seed=args.seed, **({"only": args.only} if args.only is not None else {}))
    print(demo.summary(metrics) if demo.summary else json.dumps(metrics, indent=2))
    for file in demo.files:
        print(f"{'figure' if file.endswith('.png') else 'written'}: {out / file}")
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


def cmd_export(args) -> int:
    from .interop.export import export_run

    exported = export_run(_load_run(args.run_dir, "cpu"), args.out, args.format, tolerance=args.tolerance,
                          overwrite=args.overwrite, gguf_type=args.gguf_type)
    checks = ", ".join(f"{shape}: {diff:.1e}" for shape, diff in exported.max_diff.items())
    print(f"{exported.path}: {exported.format}, {', '.join(exported.inputs)} → {', '.join(exported.outputs)}; "
          f"max |diff| vs PyTorch {checks}")
    if exported.path.is_dir():
        print(f"a directory of {', '.join(file.name for file in exported.files)}")
    elif len(exported.files) > 1:
        print(f"written together (keep them side by side): {', '.join(str(file) for file in exported.files)}")
    return 0


def cmd_embed(args) -> int:
    vectors = _load_run(args.run_dir, "cpu").embed(args.text)
    for row in vectors.tolist():
        print(json.dumps([round(v, 6) for v in row]))
    if len(args.text) > 1:
        print(json.dumps({"cosine": [[round(v, 4) for v in cosines] for cosines in (vectors @ vectors.T).tolist()]}))
    return 0


class _StderrHandler(logging.StreamHandler):
    """Log to whatever ``sys.stderr`` is when a record is written (not the stream of the first ``main`` call:
    callers, tests among them, may replace it between calls)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):  # logging.StreamHandler.__init__ assigns it
        pass


def cmd_serve(args) -> int:
    from .device import resolve_device

    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be in 1..65535, got {args.port}")
    if args.max_batch < 1:
        raise CLIError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.threads is not None and args.threads < 1:
        raise CLIError(f"--threads must be >= 1, got {args.threads}")
    if args.max_queue < 1:
        raise CLIError(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.context is not None and args.context < 2:  # above the model's context: refused once it is loaded
        raise CLIError(f"--context must be at least 2 tokens, got {args.context}")
    if args.model_name is not None and any(not n.strip() for n in args.model_name):
        raise CLIError(f"--model-name must not be blank, got {args.model_name!r}")
    if args.draft_tokens < 1:  # above the context: refused once the model is loaded
        raise CLIError(f"--draft-tokens must be >= 1, got {args.draft_tokens}")
    if args.speculative == "ngram" and args.draft is not None:
        raise CLIError("--draft drafts only with --speculative draft; n-gram drafts come from the text")
    if not 0 <= args.prefix_cache_mb < float("inf"):
        raise CLIError(f"--prefix-cache-mb must be a number of MiB >= 0, got {args.prefix_cache_mb:g}")
    api_key = args.api_key if args.api_key is not None else os.environ.get("TOKENNET_API_KEY")
    if api_key is not None and not api_key.strip():
        where = "--api-key" if args.api_key is not None else "TOKENNET_API_KEY"
        raise CLIError(f"{where} is empty: give a key, or unset it to serve without one")
    try:
        from .serve.app import serve
    except ImportError as error:
        raise CLIError(f"tokennet serve needs starlette and uvicorn ({error.name} is missing): "
                       "pip install 'tokennet[serve]'") from None
    serve(args.run_dir, host=args.host, port=args.port, api_key=api_key, model_name=args.model_name,
          any_model_name=args.any_model_name, max_batch=args.max_batch, context=args.context,
          device=str(resolve_device(args.device)),
          log_level="warning" if args.quiet else "info", quantize=args.quantize, max_queue=args.max_queue,
          prefix_cache_mb=args.prefix_cache_mb, compile=False if args.no_compile else None, threads=args.threads,
          speculative=args.speculative, draft=args.draft, draft_tokens=args.draft_tokens)
    return 0


COMMANDS = {"embed": cmd_embed, "examples": cmd_examples, "export": cmd_export, "import": cmd_import,
            "list": cmd_list, "train": cmd_train, "generate": cmd_generate, "eval": cmd_eval, "demo": cmd_demo,
            "viz": cmd_viz, "report": cmd_report, "serve": cmd_serve, "explore": explore_command,
            "heads": heads_command, "probe": probe_command}


def _load_plugins(argv: list[str]) -> None:
    """Import the ``--plugin`` files named before the command (their tasks add flags to the parser)."""
    from .plugins import discover, load_file

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    discover()
    for file in known.plugin:
        load_file(file)


def main(argv: list[str] | None = None) -> int:
    from .train.budget import process_started

    # a command's clock (its --time-budget): from the process's start when this is the command line, else from now
    started = process_started() if argv is None else time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    from .errors import TokennetError

    try:
        _load_plugins(argv)
    except TokennetError as error:
        print(f"tokennet: error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    if argv[:1] == ["lm-eval"]:  # lm-eval parses its own arguments (argparse cannot pass "--model ..." through)
        try:
            return cmd_lm_eval(argv[1:])
        except (CLIError, TokennetError) as error:
            print(f"tokennet: error: {str(error).strip().splitlines()[0]}", file=sys.stderr)
            return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    quiet = args.quiet or os.environ.get("RANK", "0") != "0"  # under torchrun only rank 0 talks
    # tokennet's own progress and notes at INFO; other libraries' loggers only from WARNING up.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[_StderrHandler()], force=True)
    logging.getLogger("tokennet").setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        if args.command == "train":
            args.started = started
        return COMMANDS[args.command](args)
    except (CLIError, TokennetError) as error:
        msg = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"tokennet: error: {msg}", file=sys.stderr)
        return 2
    except OSError as error:  # the disk, permissions, a missing file: the user's to fix, not a bug
        where = f" ({error.filename})" if getattr(error, "filename", None) else ""
        print(f"tokennet: error: {error.strerror or error}{where}", file=sys.stderr)
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
