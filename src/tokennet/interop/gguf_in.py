"""Reading GGUF files (llama.cpp's format) with the ``gguf`` package: fields, tensors, blocks, the tokenizer.

A GGUF file holds metadata fields (``general.architecture``, ``llama.block_count``, ``tokenizer.ggml.tokens``,
…) and named tensors (``blk.0.attn_q.weight``). What is general to every architecture lives here; each
family's converter (:mod:`.llama`, :mod:`.gpt2`, :mod:`.gemma`) maps its names, registered for its
``general.architecture`` (:mod:`.registry` dispatches; this module imports no family file).

Tensors come back as float32 tensors or, for Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q5_K/Q6_K (whose layout tokennet keeps, see
:mod:`tokennet.layers.blockquant`), as :class:`Blocks`: the file's bits, row by row. Any other quantized
type is dequantized to float32 and named in a one-line note.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, DataError, one_line
from ..jsonio import loads as json_loads
from ..layers.blockquant import (
    RAW_FORMATS,
    WIDENS_TO_Q8_0,
    block_bytes,
    dequantize_blocks,
    group_size,
    unwritten_blocks,
    widen_to_q8_0,
)
from ..models.registry import load_state_assigned
from ..tokens.pretrained import PretrainedTokenizer

__all__ = ["read_gguf", "field", "field_count", "check_numbers", "arch_fields", "check_block_count", "build_checked",
           "f32",
           "Blocks", "KEPT_TYPES", "load_tensors", "expand_blocks", "block_formats",
           "gguf_tokenizer", "LLAMA3_PATTERN"]

KEPT_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q4_K": "q4_k", "Q5_K": "q5_k",
              "Q6_K": "q6_k"}
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
# llama.cpp's regex for its "llama-bpe" pre-tokenizer (Llama 3's; llama.cpp also uses it for cl100k vocabularies,
# "dbrx"): tokennet's "gpt4" pattern with greedy instead of possessive quantifiers, which split text the same way.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_NAMES = ("llama-bpe", "llama3", "dbrx", "smaug-bpe")


def field(reader, key: str, default=None):
    """The value of a metadata field (a string, a number, or a list of them), or ``default``."""
    entry = reader.fields.get(key)
    if entry is None:
        return default
    from gguf import GGUFValueType

    try:
        if entry.types[0] == GGUFValueType.STRING:
            return bytes(entry.parts[entry.data[0]]).decode("utf-8")
        # read_gguf's compact arrays (or one element)
        if entry.types[0] == GGUFValueType.ARRAY and len(entry.data) == 1:
            whole = entry.parts[entry.data[0]]
            if isinstance(whole, _Strings):
                return whole.decode()
            if len(entry.types) == 2 and whole.size == int(entry.parts[entry.data[0] - 1][0]):
                return whole.tolist()
        if entry.types[0] == GGUFValueType.ARRAY:
            if entry.types[-1] == GGUFValueType.STRING:
                return [bytes(entry.parts[i]).decode("utf-8", errors="replace") for i in entry.data]
            return [entry.parts[i].tolist()[0] for i in entry.data]
        return entry.parts[entry.data[0]].tolist()[0]
    except (UnicodeDecodeError, IndexError) as err:  # a damaged file: a string that is not UTF-8, a value cut short
        where = getattr(reader.data, "filename", None) or "the GGUF file"
        raise DataError(f"{where}: GGUF field {key!r} cannot be read ({type(err).__name__}): the file is "
                        "damaged; nothing was written") from None


def field_count(reader, key: str) -> int:
    """The number of values of an array field (0 when absent), without reading them."""
    entry = reader.fields.get(key)
    if entry is None:
        return 0
    from gguf import GGUFValueType

    if entry.types[0] != GGUFValueType.ARRAY:
        return 1
    return len(entry.parts[entry.data[0]]) if len(entry.data) == 1 else len(entry.data)


def check_numbers(path: Path, prefix: str, values: dict[str, Any], *, counts: tuple[str, ...],
                  reals: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    """Refuse header fields of the wrong type before anything is built from them: ``counts`` must be positive
    integers (or absent), ``reals`` finite numbers (or absent); the ``required`` ones may not be absent."""
    absent = [k for k in required if values.get(k) is None]
    if absent:
        raise DataError(f"{path} lacks the GGUF field {prefix}.{absent[0]} the converter needs; nothing was written")
    for k in counts:
        v = values.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise DataError(f"{path}: GGUF field {prefix}.{k} = {_short(v)} is not a positive integer; "
                            "nothing was written")
    for k in reals:
        v = values.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)):
            raise DataError(f"{path}: GGUF field {prefix}.{k} = {_short(v)} is not a finite number; "
                            "nothing was written")


def arch_fields(path: Path, reader, arch: str, keys: tuple[str, ...], *, reals: tuple[str, ...],
                required: tuple[str, ...], unknown: str = "") -> dict[str, Any]:
    """The header fields ``{arch}.{key}`` a converter reads, checked before anything is built: the file must be of
    architecture ``arch``, hold no ``{arch}.*`` field outside ``keys`` (one the converter would silently ignore;
    ``unknown`` says why it is refused), and give numbers as :func:`check_numbers` asks."""
    found = field(reader, "general.architecture")
    if found != arch:
        raise ConfigError(f"{path}: GGUF architecture {found!r} is not {arch}; nothing was written")
    for key in reader.fields:
        if key.startswith(arch + ".") and key[len(arch) + 1:] not in keys:
            raise ConfigError(f"{path}: GGUF field {key!r} is not known to the {arch} converter{unknown}; "
                              "nothing was written")
    fields = {k: field(reader, f"{arch}.{k}") for k in keys}
    check_numbers(path, arch, fields, counts=tuple(k for k in keys if k not in reals), reals=reals, required=required)
    return fields


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_block_count(path: Path, weights: dict[str, Any], layers: int) -> None:
    """The header's layer count against the file's ``blk.N.*`` tensors, before a model of that depth is built
    (a damaged count must not make the converter loop over, or allocate, a billion layers)."""
    found = {int(name.split(".")[1]) for name in weights
             if name.startswith("blk.") and name.split(".")[1].isdigit()}
    if len(found) != layers or max(found, default=-1) != layers - 1:
        raise DataError(f"{path}: the header says {layers} layer(s) but the file holds tensors of "
                        f"{len(found)} (blk.N.*); nothing was written")


def _shape(w) -> tuple[int, ...]:
    """The shape of the matrix a tensor or :class:`Blocks` stands for."""
    if isinstance(w, Blocks):
        if w.fmt in RAW_FORMATS:
            return (w.qs.shape[0], w.qs.shape[1] // block_bytes(w.fmt) * group_size(w.fmt))
        return (w.qs.shape[0], w.qs.shape[1] * (1 if w.fmt == "q8_0" else 2))
    return tuple(w.shape)


def build_checked(model_class, config, names, *, sizes: str = "in its header") -> torch.nn.Module:
    """``model_class(config)`` with the weights of the :class:`~.hf.NameMap` ``names`` (tensors and :class:`Blocks`)
    loaded, their names and shapes checked first against a model without storage: sizes a damaged header
    inflated are refused before the memory for them is asked for. ``sizes`` says where they came from."""
    try:
        with torch.device("meta"):
            # every weight a float tensor (a config that can hold GGUF blocks asks for none), none allocated
            probe = model_class(config.replace(quantized={}) if hasattr(config, "quantized") else config)
    except (RuntimeError, ValueError, OverflowError, TypeError) as err:  # TypeError: torch's "Overflow when unpacking"
        raise DataError(f"{names.where}: the sizes {sizes} do not make a model "
                        f"({one_line(err)[:200]}); nothing was written") from None
    expected = probe.state_dict()
    if names.missing or names.unused():
        names.finish(probe)  # raises, naming the tensors
    for k, t in expected.items():
        if k in names.state and _shape(names.state[k]) != tuple(t.shape):
            raise DataError(f"{names.where}: tensor {k!r} has shape {_shape(names.state[k])}, the sizes {sizes} "
                            f"make {tuple(t.shape)}; nothing was written")
    names.state = expand_blocks(names.state)
    with unwritten_blocks():
        model = model_class(config)  # block buffers allocated, not written: the file's blocks take their place
    load_state_assigned(model, names.finish(model))  # the file's blocks become the model's: no second copy
    return model


def f32(value: float | None) -> float | None:
    """A float32 field as the shortest decimal that is the same float32 (``1e-05``, not ``9.99999974e-06``)."""
    return None if value is None else float(str(np.float32(value)))


def read_gguf(path: Path):
    """Open a GGUF file with the ``gguf`` package; a one-line error when it is not one (or is truncated)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise DataError("reading GGUF files needs the gguf package: pip install gguf") from None
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    from gguf import GGUFValueType

    class BoundedReader(GGUFReader):
        """The gguf package's reader, refusing every read past the end of the file: its own reads return short
        arrays there, and a count inflated by one flipped bit then loops for ~2**40 empty reads of an array.

        Arrays are read compactly: the package makes one numpy view per element (and two per string), which
        for a 262,144-piece vocabulary (pieces, scores, types) is ~10⁶ objects and ~700 MB. Here an array of
        numbers is one numpy array (the one part ``data`` names) and an array of strings a :class:`_Strings`
        (the bytes once, with each string's start and length), which :func:`field` decodes."""

        def _get(self, offset, dtype, count=1, override_order=None):
            if int(offset) + np.dtype(dtype).itemsize * int(count) > len(self.data):
                raise ValueError(f"a field at byte {int(offset)} runs past the end of the file")
            return super()._get(offset, dtype, count, override_order)

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            itype, n, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                arr = self._get(offs, nptype, n)
                return 12 + int(arr.nbytes), [raw_itype, alen, arr], [2], [GGUFValueType.ARRAY, itype]
            if itype == GGUFValueType.STRING:
                strings = _Strings.read(self.data, offs, n)
                return 12 + strings.size, [raw_itype, alen, strings], [2], [GGUFValueType.ARRAY, itype]
            return super()._get_field_parts(orig_offs, raw_type)  # arrays of arrays: the package's way

    try:
        return BoundedReader(str(path))
    except (ValueError, OSError, KeyError, IndexError, EOFError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise DataError(f"{path} is not a readable GGUF file (truncated or damaged?): {first}") from None


class _Strings:
    """An array of GGUF strings (each a uint64 length and its UTF-8 bytes) held as one ``bytes`` object with the
    start and length of each string: what :func:`read_gguf`'s reader keeps of ``tokenizer.ggml.tokens``."""

    def __init__(self, blob: bytes, starts: np.ndarray, lengths: np.ndarray, size: int):
        self.blob, self.starts, self.lengths, self.size = blob, starts, lengths, size
        self.nbytes = size

    @classmethod
    def read(cls, data: np.ndarray, offset: int, n: int) -> _Strings:
        """``n`` strings from byte ``offset`` of the file's map ``data``; a length past the end raises ValueError."""
        view, end = memoryview(data).cast("B"), len(data)
        if n > (end - offset) // 8:
            raise ValueError(f"an array at byte {offset} of {n} strings runs past the end of the file")
        starts = np.empty(n, dtype=np.int64)
        lengths = np.empty(n, dtype=np.int64)
        pos = offset
        for i in range(n):
            if pos + 8 > end:
                raise ValueError(f"a string at byte {pos} runs past the end of the file")
            k = int.from_bytes(view[pos:pos + 8], "little")
            if pos + 8 + k > end:
                raise ValueError(f"a string at byte {pos} runs past the end of the file")
            starts[i], lengths[i] = pos + 8, k
            pos += 8 + k
        blob = bytes(view[offset:pos])
        return cls(blob, starts - offset, lengths, pos - offset)

    def decode(self) -> list[str]:
        blob = self.blob
        return [blob[start:start + k].decode("utf-8", errors="replace")
                for start, k in zip(self.starts.tolist(), self.lengths.tolist())]

    def __len__(self) -> int:
        return len(self.starts)


def _dequantize(t, f=None) -> Tensor:
    """A tensor of a type tokennet does not keep (a norm's float32 gain, a Q2_K matrix) as float32 (``f``: the file,
    open, to read the bytes from instead of the memory map; see :func:`_tensor_bytes`)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    data = t.data if f is None else _tensor_bytes(t, f).view(t.data.dtype).reshape(t.data.shape)
    try:
        array = dequantize(data, t.tensor_type)
    except (NotImplementedError, KeyError, ValueError) as err:
        raise ConfigError(f"tensor {t.name} has GGUF type {GGMLQuantizationType(t.tensor_type).name}, which the gguf "
                          f"package cannot dequantize ({err}); nothing was written") from None
    shape = tuple(reversed([int(n) for n in t.shape]))  # GGUF lists dims innermost first
    return torch.from_numpy(array.astype("float32", copy=False).reshape(shape).copy())


@dataclass
class Blocks:
    """A GGUF matrix kept in its blocks: ``qs``, ``d``, ``m`` row by row (see :mod:`tokennet.layers.blockquant`;
    for Q5_0 and the K-quants ``qs`` is each row's bytes and ``d``, ``m`` are None)."""

    fmt: str
    qs: Tensor
    d: Tensor | None = None
    m: Tensor | None = None

    def rows(self, index: Tensor) -> Blocks:
        """The blocks of the rows ``index`` (a permutation or a selection of output channels)."""
        return Blocks(self.fmt, self.qs[index], None if self.d is None else self.d[index],
                      None if self.m is None else self.m[index])

    def dense(self) -> Tensor:
        return dequantize_blocks(self.fmt, self.qs, self.d, self.m)

    @staticmethod
    def cat(parts: list[Blocks]) -> Blocks:
        """Rows stacked (Q, K, V into one projection); all parts in one format."""
        m = None if parts[0].m is None else torch.cat([part.m for part in parts])
        scales = None if parts[0].d is None else torch.cat([part.d for part in parts])
        return Blocks(parts[0].fmt, torch.cat([part.qs for part in parts]), scales, m)


def _tensor_bytes(t, f=None) -> np.ndarray:
    """A tensor's bytes: read from the open file ``f`` when given — not through the reader's memory map, whose pages
    would stay resident beside the copy (twice the file in memory at the end of an import; and a read of a few bytes
    there maps the file's pages around them: Gemma 3's 109 small norm gains read through the map left 41 MB of
    it resident) — else the map's view."""
    if f is None:
        return np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
    buf = np.empty(int(t.n_bytes), dtype=np.uint8)
    f.seek(int(t.data_offset))
    if f.readinto(memoryview(buf)) != buf.nbytes:
        raise ValueError(f"the file ends inside tensor {t.name}")
    return buf


def _blocks(t, f=None) -> Blocks:
    """The raw bytes of a Q8_0/Q4_0/Q4_1 tensor ``(N, bytes per row)`` split into ``qs``, ``d`` and ``m``; of a
    Q5_0/K-quant tensor, kept whole as ``qs`` (``f``: the file, open, to read the bytes from)."""
    from gguf import GGMLQuantizationType

    fmt = KEPT_TYPES[GGMLQuantizationType(t.tensor_type).name]
    K, N = (int(n) for n in t.shape)
    Q = group_size(fmt)
    if K % Q or N < 1:
        raise ValueError(f"rows of {K} values are not whole blocks of {Q}")
    if fmt in RAW_FORMATS:
        raw = _tensor_bytes(t, f).reshape(N, K // Q * block_bytes(fmt))  # (N, bytes per row)
        return Blocks(fmt, torch.from_numpy(raw if f is not None else raw.copy()))
    # Split into scales and values a few MB of rows at a time: never the whole tensor twice in memory.
    G, B = K // 32, block_bytes(fmt)
    head = 4 if fmt == "q4_1" else 2
    quants = np.empty((N, G, B - head), dtype=np.uint8)
    scales = np.empty((N, G), dtype=np.float16)
    m = np.empty((N, G), dtype=np.float16) if fmt == "q4_1" else None
    step = max(1, (4 << 20) // (G * B))
    whole = None if f is not None else _tensor_bytes(t).reshape(N, G, B)
    for row in range(0, N, step):
        n = min(step, N - row)
        if whole is not None:
            raw = whole[row:row + n]
        else:
            raw = np.empty((n, G, B), dtype=np.uint8)
            f.seek(int(t.data_offset) + row * G * B)
            if f.readinto(memoryview(raw).cast("B")) != raw.nbytes:
                raise ValueError(f"the file ends inside tensor {t.name}")
        scales[row:row + n] = raw[..., :2].copy().view(np.float16)[..., 0]
        if m is not None:
            m[row:row + n] = raw[..., 2:4].copy().view(np.float16)[..., 0]
        quants[row:row + n] = raw[..., head:]
    q = torch.from_numpy(quants.reshape(N, -1))  # (N, K) int8 or (N, K/2) packed nibbles
    return Blocks(fmt, q.view(torch.int8) if fmt == "q8_0" else q, torch.from_numpy(scales),
                  None if m is None else torch.from_numpy(m))


def load_tensors(reader, path: Path, *, keep_blocks: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Every tensor of the file by name: :class:`Blocks` for the kept types (matrices), float32 otherwise.

    Returns:
        ``(tensors, notes)``: a note names the quantized types that were dequantized.
    """
    from gguf import GGMLQuantizationType

    out: dict[str, Any] = {}
    dequantized: set[str] = set()
    with open(path, "rb") as file:  # blocks are read from the file, not through the memory map
        for t in reader.tensors:
            kind = GGMLQuantizationType(t.tensor_type).name
            try:
                if keep_blocks and kind in KEPT_TYPES and len(t.shape) == 2:
                    out[t.name] = _blocks(t, file)
                else:
                    out[t.name] = _dequantize(t, file)
                    if kind not in FLOAT_TYPES:
                        dequantized.add(kind)
            except (ConfigError, DataError):
                raise
            except (ValueError, IndexError) as err:  # a damaged tensor info: a shape its bytes cannot have
                shape = [int(n) for n in t.shape]
                raise DataError(f"{path}: tensor {t.name} (GGUF type {kind}, shape {shape}) cannot be read "
                                f"({(str(err).splitlines() or [type(err).__name__])[0]}); nothing was written"
                                ) from None
    notes = []
    if dequantized and keep_blocks:
        notes.append(f"{path.name}: tensors of GGUF type {', '.join(sorted(dequantized))} were dequantized to float32 "
                     f"(tokennet keeps {', '.join(KEPT_TYPES)} blocks as they are)")
    return out, notes


def dense(w) -> Tensor:
    """A float32 tensor, whether ``w`` is one or :class:`Blocks`."""
    return w.dense() if isinstance(w, Blocks) else w


def stack_rows(mixed: list[str], name: str, widened: list[str] | None = None):
    """``f(*parts)`` stacking rows (``[W_q; W_k; W_v]``): blocks when all parts share a format; Q8_0 blocks when they
    mix Q8_0, Q4_0 and Q5_0 (which widen to Q8_0 exactly, see :func:`~tokennet.layers.blockquant.widen_to_q8_0`;
    ``name`` joins ``widened``); float32 otherwise (and ``name`` joins ``mixed``)."""
    def cat(*parts):
        if all(isinstance(part, Blocks) for part in parts):
            if len({part.fmt for part in parts}) == 1:
                return Blocks.cat(list(parts))
            if all(part.fmt in WIDENS_TO_Q8_0 for part in parts):
                if widened is not None:
                    widened.append(name)
                return Blocks.cat([Blocks("q8_0", *widen_to_q8_0(part.fmt, part.qs, part.d)) for part in parts])
        if any(isinstance(part, Blocks) for part in parts):
            mixed.append(name)
        return torch.cat([dense(part) for part in parts])
    return cat


def expand_blocks(state: dict[str, Any]) -> dict[str, Tensor]:
    """State-dict entries: ``X.weight`` held as :class:`Blocks` becomes ``X.qs``, ``X.d`` (and ``X.m``)."""
    out = {}
    for k, v in state.items():
        if isinstance(v, Blocks):
            base = k.removesuffix(".weight")
            out[base + ".qs"] = v.qs
            if v.d is not None:
                out[base + ".d"] = v.d
            if v.m is not None:
                out[base + ".m"] = v.m
        else:
            out[k] = v
    return out


def block_formats(state: dict[str, Any], num_layers: int) -> dict[str, str]:
    """The GPT config's ``quantized`` field: module → block format, one ``*`` entry when every layer agrees."""
    named = {k.removesuffix(".weight"): v.fmt for k, v in state.items() if isinstance(v, Blocks)}
    out: dict[str, str] = {}
    for name, fmt in sorted(named.items()):
        parts = name.split(".")
        if name.startswith("decoder.blocks."):
            same = [named.get(".".join(parts[:2] + [str(i)] + parts[3:])) for i in range(num_layers)]
            if all(other == fmt for other in same):
                out[".".join(parts[:2] + ["*"] + parts[3:])] = fmt
                continue
        out[name] = fmt
    return out


def gguf_tokenizer(reader, path: Path, vocab_size: int) -> PretrainedTokenizer:
    """The file's byte-level BPE tokenizer (``tokenizer.ggml.*``), checked against the model's vocabulary."""
    get = lambda k: field(reader, "tokenizer." + k)  # noqa: E731
    pre = get("ggml.pre")
    kwargs = dict(model=get("ggml.model"), tokens=get("ggml.tokens") or [], token_types=get("ggml.token_type"),
              merges=get("ggml.merges"), bos_id=get("ggml.bos_token_id"), eos_id=get("ggml.eos_token_id"),
              pad_id=get("ggml.padding_token_id"), unk_id=get("ggml.unknown_token_id"),
              chat_template=get("chat_template"), where=str(path))
    if pre in _LLAMA3_NAMES:  # a pre-tokenizer tokens/pretrained.py does not name: set its regex here
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        split = Tokenizer(models.BPE())
        split.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        data = PretrainedTokenizer.from_gguf_fields(pre="gpt2", **kwargs).to_dict()
        data["engine"]["pre_tokenizer"] = json_loads(split.to_str(), what="tokenizer JSON")["pre_tokenizer"]
        tok = PretrainedTokenizer.from_dict(data)
    else:
        tok = PretrainedTokenizer.from_gguf_fields(pre=pre, **kwargs)
    if tok.vocab_size != vocab_size:
        raise DataError(f"{path}: the tokenizer has {tok.vocab_size} tokens but the model {vocab_size}; "
                        "nothing was written")
    return tok
