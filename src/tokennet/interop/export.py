"""Standard formats out: a run's network as ONNX (``torch.onnx.export(dynamo=True)``) or a ``torch.export`` program.

What is exported is the network's forward pass, one call from inputs to outputs, with dynamic batch (and,
for token models, sequence length):

==============  =====================================  ================================  ===============
family          input                                  output                            dynamic
==============  =====================================  ================================  ===============
``gpt``         ``idx`` (B, T) int64 token ids          ``logits`` (B, T, V)              B, T ≤ block_size
``vit``         ``images`` (B, C, H, W) float32          ``logits`` (B, K)                 B
``seq2seq``     ``src`` (B, S) int64, ``pad_id`` padded  ``memory`` (B, S, D): the encoder  B, S ≤ max_source_len
``text-encoder`` ``ids`` (B, N) int64, ``pad_id`` padded ``embeddings`` (B, D), normalized B, N ≤ max_len
==============  =====================================  ================================  ===============

Not exported: the decoding loop (sampling, beam search, the KV cache), the seq2seq decoder, the
tokenizer and the input checks (a Python ``raise`` on bad ids cannot be traced). Every export is
checked: the written file is loaded back (onnxruntime for ONNX, ``torch.export.load`` for pt2) and run
on two input shapes (other than the one traced; sequences up to :data:`CHECK_LEN` tokens) against the
PyTorch model; max |difference| must be ≤ :data:`TOLERANCE`, or nothing is written.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attention.masks import padding
from ..errors import ConfigError, RunError
from ..run import Run

__all__ = ["export_run", "ExportResult", "FORMATS", "TOLERANCE", "EXPORTABLE"]

logger = logging.getLogger(__name__)

FORMATS = ("onnx", "pt2")
TOLERANCE = 1e-4
CHECK_LEN = 64  # the longest sequence of the check (a long context would cost minutes and gigabytes)
EXPORTABLE = ("gpt", "vit", "seq2seq", "text-encoder")


@dataclass
class ExportResult:
    """The written file, what it takes and returns, and the check: ``shape → max |exported − PyTorch|``.

    ``files``: every file written — the model, and beside an ONNX model the weights file it names.
    """

    path: Path
    format: str
    inputs: list[str]
    outputs: list[str]
    max_diff: dict[str, float]
    files: list[Path] = field(default_factory=list)


class _Logits(nn.Module):
    """``forward(x) → logits``: a model's ``Output`` dataclass is not an exportable return value."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).logits


class _Seq2SeqEncoder(nn.Module):
    """``forward(src (B, S)) → memory (B, S, D)``: the encoder of a seq2seq model, padding masked.

    The same computation as ``Seq2Seq.encode`` without its id checks, whose Python branches on tensor
    values cannot be traced.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> Tensor:
        m = self.model
        return m.encoder(m.embed(src), mask=padding(src.eq(m.config.pad_id)))  # (B, S, D)


class _Embeddings(nn.Module):
    """``forward(ids (B, N)) → sentence embeddings (B, D)``, padding (``pad_id``) masked out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        return self.model.embed(ids)


def _spec(model: nn.Module):
    """``(wrapper, input name, output name, dynamic dims {axis: Dim}, two check inputs, example input)``."""
    c, family = model.config, model.config.family
    g = torch.Generator().manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=4096)
    if family == "gpt":
        seq = torch.export.Dim("seq", min=1, max=c.block_size)
        T = min(c.block_size, CHECK_LEN)
        ids = [torch.randint(c.vocab_size, s, generator=g) for s in ((2, max(2, T // 2)), (3, T), (1, 1))]
        return _Logits(model), "idx", "logits", {0: batch, 1: seq}, ids[1:], ids[0]
    if family == "vit":
        shape = (c.in_channels, c.image_hw[1]) if c.is_1d else (c.in_channels, *c.image_hw)
        x = [torch.rand(b, *shape, generator=g) for b in (2, 5, 1)]
        return _Logits(model), "images", "logits", {0: batch}, x[1:], x[0]
    if family == "seq2seq":
        seq = torch.export.Dim("seq", min=1, max=c.max_source_len)
        S = min(c.max_source_len, CHECK_LEN)
        src = [torch.randint(c.vocab_size, s, generator=g) for s in ((2, max(2, S // 2)), (3, S), (1, 1))]
        src[1][:, S // 2:] = c.pad_id  # padding exercised
        return _Seq2SeqEncoder(model), "src", "memory", {0: batch, 1: seq}, src[1:], src[0]
    if family == "text-encoder":
        seq = torch.export.Dim("seq", min=1, max=c.max_len)
        N = min(c.max_len, CHECK_LEN)
        ids = [torch.randint(1, c.vocab_size, s, generator=g) for s in ((2, max(2, N // 2)), (3, N), (1, 1))]
        ids[1][1:, N // 2:] = c.pad_id  # padding exercised
        return _Embeddings(model), "ids", "embeddings", {0: batch, 1: seq}, ids[1:], ids[0]
    raise ConfigError(f"exporting a {family} model is not supported (exportable families: {', '.join(EXPORTABLE)})")


def _run_exported(path: Path, fmt: str, x: Tensor) -> Tensor:
    if fmt == "pt2":
        return torch.export.load(str(path)).module()(x)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])


def export_run(run: Run, out: str | Path, fmt: str, *, tolerance: float = TOLERANCE) -> ExportResult:
    """Export a run's network to ``out`` in format ``fmt`` (``"onnx"`` or ``"pt2"``), and check the file.

    Args:
        run: a loaded run (``tokennet.load``); its model is exported on the CPU in eval mode.
        out: the file to write; it is written under a temporary name and renamed only once the check passes.
        fmt: ``"onnx"`` (opset chosen by PyTorch's dynamo exporter) or ``"pt2"`` (``torch.export.save``).
        tolerance: the largest max |exported − PyTorch| accepted on the check's inputs.
    """
    if not tolerance > 0:
        raise ConfigError(f"tolerance must be > 0, got {tolerance}")
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as e:
            raise RunError(f"ONNX export needs the packages onnx, onnxscript and onnxruntime ({e.name} is missing): "
                           "pip install onnx onnxscript onnxruntime") from None
    out = Path(out)
    if out.is_dir():
        raise RunError(f"{out} is a directory; give a file name for the exported model")
    model = run.model.to("cpu").eval()
    wrapper, in_name, out_name, dims, checks, example = _spec(model)
    wrapper.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written into a private directory under the final name, then moved out: the dynamo ONNX exporter puts
    # the weights in a second file (``<name>.data``) that the .onnx file names, so both keep their names.
    tmp_dir = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / out.name
    # The ONNX optimizer logs every folded constant at INFO: keep it to warnings while exporting.
    quiet = [logging.getLogger(n) for n in ("onnxscript", "onnx_ir")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        with torch.no_grad():
            if fmt == "pt2":
                program = torch.export.export(wrapper, (example,), dynamic_shapes=(dims,))
                torch.export.save(program, str(tmp))
            else:
                torch.onnx.export(wrapper, (example,), str(tmp), dynamo=True, verbose=False,
                                  input_names=[in_name], output_names=[out_name],
                                  dynamic_shapes=(dims,))
            diffs = {}
            for x in checks:
                ref = wrapper(x)
                got = _run_exported(tmp, fmt, x)
                diffs["x".join(map(str, x.shape))] = float((got - ref).abs().max())
        bad = {k: v for k, v in diffs.items() if not v <= tolerance}
        if bad:
            raise RunError(f"the exported {fmt} model differs from PyTorch's by {max(bad.values()):.2e} "
                           f"(> {tolerance}) on input shape {next(iter(bad))}; nothing was written (--tolerance sets "
                           "the limit)")
        files = sorted(tmp_dir.iterdir())
        for f in files:
            f.replace(out.parent / f.name)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("exported %s to %s; max |diff| vs PyTorch: %s", run.path, out, diffs)
    return ExportResult(out, fmt, [in_name], [out_name], diffs, [out.parent / f.name for f in files])
