"""Standard formats out: a run's network as ONNX (``torch.onnx.export(dynamo=True)``) or a ``torch.export`` program;
a ``gpt`` run also as a GGUF file for llama.cpp (:mod:`.gguf_out`) or a Hugging Face directory (:mod:`.hf_out`).

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

Weights a run holds in GGUF blocks (an imported GGUF file's) are dequantized to float32 for ONNX, which has no
such type; pt2 keeps them (the program unpacks them), GGUF writes them as they are, and a Hugging Face directory
holds their float32 values.

Not exported (ONNX, pt2): the decoding loop (sampling, beam search, the KV cache), the seq2seq decoder, the
tokenizer and the input checks (a Python ``raise`` on bad ids cannot be traced). GGUF and Hugging Face
directories carry the whole language model with its tokenizer (and chat template), for other engines.

Every export is checked: the written file is loaded back (onnxruntime for ONNX, ``torch.export.load`` for
pt2, tokennet's own importers for GGUF and Hugging Face) and run on two input shapes (other than the one
traced; sequences up to :data:`CHECK_LEN` tokens) against the PyTorch model, or nothing is written. The
default check is a combined tolerance, like ``torch.testing.assert_close`` with the absolute part scaled to
the outputs: every element must satisfy ``|got − ref| ≤ atol · max|ref| + rtol · |ref|`` with
:data:`RTOL` = :data:`ATOL` = 1e-4. Float32 rounding across a deep network grows with the size of the
logits (SmolLM2-135M's ONNX logits, up to ~34, differ by ~5e-4: a relative error near 1e-5), which a fixed
absolute limit mistakes for a failed export; a real mismatch (a wrong operation, a swapped tensor) is off
by a sizeable fraction of the outputs and is still refused. GGUF files in float16 or Q8_0 are checked with
their rounding's tolerance (:data:`GGUF_TOLERANCE`). ``tolerance=`` replaces the check by an absolute limit
on max |difference|.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attention.masks import padding
from ..errors import ConfigError, RunError
from ..fileio import temp_dir_beside, temp_name_beside
from ..jsonio import load as load_json
from ..run import Run

__all__ = ["export_run", "ExportResult", "FORMATS", "TOLERANCE", "EXPORTABLE"]

logger = logging.getLogger(__name__)

FORMATS = ("onnx", "pt2", "gguf", "hf")
RTOL, ATOL = 1e-4, 1e-4  # the default check: |got − ref| ≤ ATOL · max|ref| + RTOL · |ref|
TOLERANCE = None  # the default: the combined check above (a number: an absolute limit on max |got − ref|)
GGUF_TOLERANCE = {"f32": (RTOL, ATOL), "f16": (1e-2, 1e-2), "q8_0": (5e-2, 5e-2)}  # (rtol, atol) of each file type
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
    cfg, family = model.config, model.config.family
    gen = torch.Generator().manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=4096)
    if family == "gpt":
        seq = torch.export.Dim("seq", min=1, max=cfg.block_size)
        T = min(cfg.block_size, CHECK_LEN)
        ids = [torch.randint(cfg.vocab_size, size, generator=gen) for size in ((2, max(2, T // 2)), (3, T), (1, 1))]
        return _Logits(model), "idx", "logits", {0: batch, 1: seq}, ids[1:], ids[0]
    if family == "vit":
        shape = (cfg.in_channels, cfg.image_hw[1]) if cfg.is_1d else (cfg.in_channels, *cfg.image_hw)
        x = [torch.rand(count, *shape, generator=gen) for count in (2, 5, 1)]
        return _Logits(model), "images", "logits", {0: batch}, x[1:], x[0]
    if family == "seq2seq":
        seq = torch.export.Dim("seq", min=1, max=cfg.max_source_len)
        S = min(cfg.max_source_len, CHECK_LEN)
        src = [torch.randint(cfg.vocab_size, size, generator=gen) for size in ((2, max(2, S // 2)), (3, S), (1, 1))]
        src[1][:, S // 2:] = cfg.pad_id  # padding exercised
        return _Seq2SeqEncoder(model), "src", "memory", {0: batch, 1: seq}, src[1:], src[0]
    if family == "text-encoder":
        seq = torch.export.Dim("seq", min=1, max=cfg.max_len)
        N = min(cfg.max_len, CHECK_LEN)
        ids = [torch.randint(1, cfg.vocab_size, size, generator=gen) for size in ((2, max(2, N // 2)), (3, N), (1, 1))]
        ids[1][1:, N // 2:] = cfg.pad_id  # padding exercised
        return _Embeddings(model), "ids", "embeddings", {0: batch, 1: seq}, ids[1:], ids[0]
    raise ConfigError(f"exporting a {family} model is not supported (exportable families: {', '.join(EXPORTABLE)})")


def _onnx_model(model: nn.Module) -> nn.Module:
    """The model, or a copy with its GGUF blocks dequantized to float32: ONNX has no type for GGUF blocks (and the
    bit unpacking of a traced dequantization mixes uint8 and int8 tensors that onnxruntime refuses), so the
    exported file holds the float32 weights the blocks stand for — the same numbers the run computes with."""
    from .hf_out import _float_model

    return _float_model(model)


def _run_exported(path: Path, fmt: str, x: Tensor) -> Tensor:
    if fmt == "pt2":
        return torch.export.load(str(path)).module()(x)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])


def _check(got: Tensor, ref: Tensor, tolerance: float | None, rtol: float = RTOL, atol: float = ATOL):
    """``(max |got − ref|, passed, what was allowed)`` under the combined check or an absolute ``tolerance``."""
    diff = (got.float() - ref.float()).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if tolerance is not None:
        return worst, worst <= tolerance, f"{tolerance:g}"
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    ok = bool((diff <= atol * scale + rtol * ref.float().abs()).all())
    return worst, ok, f"{atol:g}·max|logits| + {rtol:g}·|logit| with max|logits| = {scale:.3g}"


HF_EXPORT_FILES = ("config.json", "model.safetensors")  # what makes a directory a Hugging Face export


def _not_an_export(path: Path, fmt: str) -> str | None:
    """Why ``path`` is not a previous ``fmt`` export that ``--overwrite`` may replace; None when it is one."""
    import zipfile

    from ..run import is_run_dir

    if fmt == "hf":
        if not path.is_dir() or path.is_symlink():
            return "it is not a directory"
        if is_run_dir(path):
            return "it is a tokennet run directory"
        try:
            cfg = load_json(path / "config.json")
        except (OSError, ValueError):  # ValueError: not JSON, not UTF-8, or nested too deep (JSONTooDeep)
            cfg = None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
            return "it has no config.json with a model_type"
        if not (path / "model.safetensors").is_file():
            return "it has no model.safetensors"
        return None
    if not path.is_file() or path.is_symlink():
        return "it is not a file"
    with open(path, "rb") as file:
        head = file.read(4)
    if fmt == "gguf":
        return None if head == b"GGUF" else "it is not a GGUF file (no GGUF magic)"
    if fmt == "pt2":
        try:
            with zipfile.ZipFile(path) as z:
                if any(n.endswith("/archive_format") for n in z.namelist()):
                    return None
        except (zipfile.BadZipFile, OSError):
            pass
        return "it is not a torch.export archive"
    try:  # onnx: a model proto with a graph (its weights file is not read)
        import onnx

        m = onnx.load_model(str(path), load_external_data=False)
        if m.ir_version > 0 and len(m.graph.node) > 0:
            return None
    except Exception:  # noqa: BLE001 - any parse failure means: not an ONNX model
        pass
    return "it is not an ONNX model"


def _check_out(run: Run, out: Path, fmt: str, overwrite: bool) -> None:
    """Refuse, before anything is exported, an ``out`` that is the run (or inside it, or holding it), or an existing
    path that is not a previous export of this format; an existing one is replaced only with ``overwrite``."""
    if fmt != "hf" and out.is_dir():
        raise RunError(f"{out} is a directory; give a file name for the exported model")
    out_real, run_real = out.resolve(), run.path.resolve()
    if out_real == run_real or run_real in out_real.parents or out_real in run_real.parents:
        where = "is" if out_real == run_real else "is inside" if run_real in out_real.parents else "holds"
        raise RunError(f"--out {out} {where} the run being exported ({run.path}); write the export outside it "
                       "(nothing was written)")
    empty_dir = fmt == "hf" and out.is_dir() and not out.is_symlink() and not any(out.iterdir())
    if (out.exists() or out.is_symlink()) and not empty_dir:  # an empty directory is as good as none
        if not overwrite:
            raise RunError(f"{out} exists; pass --overwrite to replace it (nothing was written)")
        why = _not_an_export(out, fmt)
        if why is not None:
            raise RunError(f"refusing to overwrite {out}: {why}; --overwrite replaces only a previous {fmt} export "
                           "(nothing was written)")
    if fmt == "onnx":  # the weights file beside the model is replaced with it, and only with it
        data = out.with_name(f"{out.name}.data")
        if (data.exists() or data.is_symlink()) and not (out.exists() and overwrite and data.is_file()):
            raise RunError(f"{data} exists and is not the weights file of an ONNX export being replaced; move it or "
                           "choose another --out (nothing was written)")


def _replace(tmp_files: list[Path], out: Path) -> list[Path]:
    """Move checked files into place (``tmp_files[0]`` becomes ``out``; others keep their names beside it) and
    remove what the old export at ``out`` had that the new one has not.

    A file replaces the old one in one rename; a directory (``hf``) trades names with the old one in one step
    (:func:`~tokennet.fileio.swap_into_place`), which is then deleted: a crash leaves the old export or the new
    one whole. An ONNX model too large for one file comes with a weights file of a name no earlier export used
    (:func:`_onnx_weights_name`), put in place first, so the rename of the model is the one step that switches
    from the old pair to the new one; the old weights file is deleted after it (a crash in between leaves it
    unreferenced, and the next export of ``out`` deletes it).
    """
    from ..fileio import swap_into_place

    stale = _onnx_weights(out) if out.suffix == ".onnx" else []
    placed = []
    for tmp_file in reversed(tmp_files):
        dest = out if tmp_file is tmp_files[0] else out.parent / tmp_file.name
        if tmp_file.is_dir():
            trash = swap_into_place(tmp_file, dest)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        else:
            tmp_file.replace(dest)
        placed.append(dest)
    for old in stale:
        if old not in placed:
            old.unlink(missing_ok=True)
    return placed[::-1]


ONNX_ONE_FILE_LIMIT = 1_800_000_000  # bytes of weights: protobuf caps a file at 2 GiB, the graph needs some of it


def _onnx_weights(out: Path) -> list[Path]:
    """The weights files an ONNX export at ``out`` may have beside it: ``NAME.data`` (the exporter's own name) and
    ``NAME.XXXXXXXX.data`` (:func:`_onnx_weights_name`), whether or not the model still names them."""
    pattern = re.compile(rf"^{re.escape(out.name)}(?:\.[0-9a-f]{{8}})?\.data$")
    try:
        return [candidate for candidate in out.parent.iterdir()
                if pattern.match(candidate.name) and candidate.is_file() and not candidate.is_symlink()]
    except OSError:
        return []


def _onnx_weights_name(model_file: Path, final_name: str) -> None:
    """Rename the exporter's weights file beside ``model_file`` (``NAME.data``) to a name no earlier export of
    ``final_name`` had, ``NAME.XXXXXXXX.data``, and point the model at it (only the small graph is rewritten)."""
    import onnx

    data = model_file.with_name(f"{model_file.name}.data")
    if not data.is_file():
        return
    new = model_file.with_name(f"{final_name}.{os.urandom(4).hex()}.data")
    m = onnx.load_model(str(model_file), load_external_data=False)
    for t in onnx.external_data_helper._get_all_tensors(m):
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = new.name
    data.rename(new)
    onnx.save_model(m, str(model_file))


def export_run(run: Run, out: str | Path, fmt: str, *, tolerance: float | None = TOLERANCE, overwrite: bool = False,
               gguf_type: str = "f16") -> ExportResult:
    """Export a run's network to ``out`` in format ``fmt`` and check the result; see the module docstring.

    Args:
        run: a loaded run (``tokennet.load``); its model is exported on the CPU in eval mode.
        out: the file (a directory for ``"hf"``) to write; written under a temporary name and renamed only once
            the check passes.
        fmt: ``"onnx"`` (opset chosen by PyTorch's dynamo exporter), ``"pt2"`` (``torch.export.save``),
            ``"gguf"`` (llama.cpp) or ``"hf"`` (a Hugging Face directory); the last two for ``gpt`` runs.
        tolerance: None for the combined check; a number: the largest max |exported − PyTorch| accepted.
        overwrite: replace an existing ``out`` (otherwise an existing path is refused) — only a previous export of
            the same format (a Hugging Face directory: ``config.json`` with a ``model_type`` and
            ``model.safetensors``; a GGUF file; a ``torch.export`` archive; an ONNX model and its ``.data``), never
            the run itself, a path inside it, or anything else. The new export is built and checked beside it
            first; a failure leaves the old one in place.
        gguf_type: ``"f32"``, ``"f16"`` or ``"q8_0"``, the GGUF file type of the matrices.
    """
    if tolerance is not None and not tolerance > 0:
        raise ConfigError(f"tolerance must be > 0, got {tolerance}")
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    out = Path(out)
    _check_out(run, out, fmt, overwrite)
    if fmt in ("gguf", "hf"):
        return _export_lm(run, out, fmt, tolerance=tolerance, overwrite=overwrite, gguf_type=gguf_type)
    if fmt == "onnx":
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as err:
            raise RunError(f"ONNX export needs the packages onnx, onnxscript and onnxruntime ({err.name} is missing): "
                           "pip install onnx onnxscript onnxruntime") from None
    model = _onnx_model(run.model.to("cpu").eval()) if fmt == "onnx" else run.model.to("cpu").eval()
    wrapper, in_name, out_name, dims, checks, example = _spec(model)
    wrapper.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written into a private directory under the final name, then moved out: the dynamo ONNX exporter puts
    # the weights in a second file (``<name>.data``) that the .onnx file names, so both keep their names.
    tmp_dir = temp_dir_beside(out, "tmp")
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
                one_file = sum(t.numel() * t.element_size() for t in wrapper.state_dict().values()) \
                    <= ONNX_ONE_FILE_LIMIT
                torch.onnx.export(wrapper, (example,), str(tmp), dynamo=True, verbose=False,
                                  input_names=[in_name], output_names=[out_name],
                                  dynamic_shapes=(dims,), external_data=not one_file)
                if not one_file:
                    _onnx_weights_name(tmp, out.name)
            diffs, bad = {}, None
            for x in checks:
                shape = "x".join(map(str, x.shape))
                diffs[shape], ok, allowed = _check(_run_exported(tmp, fmt, x), wrapper(x), tolerance)
                if not ok and bad is None:
                    bad = (shape, allowed)
        if bad:
            raise RunError(f"the exported {fmt} model differs from PyTorch's by {diffs[bad[0]]:.2e} (allowed: "
                           f"{bad[1]}) on input shape {bad[0]}; nothing was written (--tolerance sets an absolute "
                           "limit)")
        files = sorted(tmp_dir.iterdir(), key=lambda file: file.name != out.name)  # the model first, then its weights
        placed = _replace(files, out)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("exported %s to %s; max |diff| vs PyTorch: %s", run.path, out, diffs)
    return ExportResult(out, fmt, [in_name], [out_name], diffs, placed)


def _export_lm(run: Run, out: Path, fmt: str, *, tolerance, overwrite: bool, gguf_type: str) -> ExportResult:
    """A language model as a GGUF file or a Hugging Face directory, read back by tokennet's importers and checked."""
    from .gguf_out import FILE_TYPES, write_gguf
    from .hf_out import write_hf
    from .registry import convert

    if fmt == "gguf" and gguf_type not in FILE_TYPES:
        raise ConfigError(f"GGUF file type must be one of {list(FILE_TYPES)}, got {gguf_type!r}")
    model = run.model.to("cpu").eval()
    if model.config.family != "gpt":
        raise ConfigError(f"{fmt} export is for gpt runs (language models); {run.path} is a {model.config.family} run")
    _, _, _, _, checks, _ = _spec(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name_beside(out, "tmp")
    notes: list[str] = []
    try:
        if fmt == "gguf":
            notes = write_gguf(model, run.tokenizer, tmp, file_type=gguf_type, name=run.path.name).notes
        else:
            write_hf(model, run.tokenizer, tmp)
        back, _, _, _ = convert(tmp)  # the file as another program would read it
        back.eval()
        rtol, atol = GGUF_TOLERANCE[gguf_type] if fmt == "gguf" else (RTOL, ATOL)
        diffs, bad = {}, None
        with torch.no_grad():
            for x in checks:
                shape = "x".join(map(str, x.shape))
                diffs[shape], ok, allowed = _check(back(x).logits, model(x).logits, tolerance, rtol, atol)
                if not ok and bad is None:
                    bad = (shape, allowed)
        if bad:
            raise RunError(f"the {fmt} export read back differs from the run's model by {diffs[bad[0]]:.2e} (allowed: "
                           f"{bad[1]}) on input shape {bad[0]}; nothing was written")
        _replace([tmp], out)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    for n in notes:
        logger.warning("%s", n)
    files = sorted(out.iterdir()) if out.is_dir() else [out]
    return ExportResult(out, fmt, ["idx"], ["logits"], diffs, files)
