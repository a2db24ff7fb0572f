"""A user's data files damaged every way: audio (WAV through scipy, FLAC through soundfile), images (PNG, JPEG,
BMP through Pillow, ``.npy`` through numpy), graph JSON (``generate --graphs``), chat JSONL (chat fine-tuning) and a
VQA directory's ``answers.tsv``. Each reads, or fails with one line naming the file; none changes the file."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated, mutated_json
from robustness.graph_cases import oversized_graphs

from tokennet.data.chats import read_chats
from tokennet.data.image_files import read_images
from tokennet.errors import TokennetError
from tokennet.tokens.audio import load_audio
from tokennet.tokens.text import train_tokenizer

soundfile = pytest.importorskip("soundfile")
PIL = pytest.importorskip("PIL.Image")


def _read_bytes(name: str, data: bytes, read, *, named: bool = True):
    """``read(path)`` of ``data`` written as ``name`` in a fresh directory; a TokennetError must name the file."""
    d = Path(tempfile.mkdtemp(prefix="data-fuzz-"))
    try:
        f = d / name
        f.write_bytes(data)
        out = check_reader(lambda: read(f), f)
        if named and isinstance(out, TokennetError):
            assert str(f) in str(out), f"the message does not name the file: {out}"
        return out
    finally:
        shutil.rmtree(d)


# -- audio and images: binary headers --------------------------------------------------------------------------------
def _audio(subtype: str, fmt: str) -> bytes:
    t = np.arange(1600) / 16000
    d = Path(tempfile.mkdtemp())
    try:
        soundfile.write(d / f"a.{fmt}", 0.5 * np.sin(2 * np.pi * 440 * t), 16000, subtype=subtype)
        return (d / f"a.{fmt}").read_bytes()
    finally:
        shutil.rmtree(d)


def _image(fmt: str) -> bytes:
    import io

    a = (np.random.default_rng(0).random((16, 16, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    if fmt == "npy":
        np.save(buf, a)
    else:
        PIL.fromarray(a).save(buf, format={"jpg": "JPEG"}.get(fmt, fmt.upper()))
    return buf.getvalue()


FILES = {  # name → (seed bytes, reader, header length)
    "pcm16.wav": (lambda: _audio("PCM_16", "wav"), lambda f: load_audio(f, 16000), 64),
    "float.wav": (lambda: _audio("FLOAT", "wav"), lambda f: load_audio(f, 16000), 64),
    "clip.flac": (lambda: _audio("PCM_16", "flac"), lambda f: load_audio(f, 16000), 64),
    "img.png": (lambda: _image("png"), lambda f: read_images([f], 16), 64),
    "img.jpg": (lambda: _image("jpg"), lambda f: read_images([f], 16), 256),
    "img.bmp": (lambda: _image("bmp"), lambda f: read_images([f], 16), 64),
    "img.npy": (lambda: _image("npy"), lambda f: read_images([f], 16), 128),
}


@pytest.mark.parametrize("name", list(FILES))
def test_the_seed_files_read(name):
    seed, read, _ = FILES[name]
    out = _read_bytes(name, seed(), read)
    assert not isinstance(out, TokennetError), out


@pytest.mark.parametrize("name", list(FILES))
@FUZZ
@given(data=st.data())
def test_damaged_audio_and_images_are_one_line(name, data):
    make, read, header = FILES[name]
    seed = _SEEDS.setdefault(name, make())
    _read_bytes(name, data.draw(mutated(seed, hot=header), label="mutation").data, read)


_SEEDS: dict[str, bytes] = {}


def test_an_image_header_declaring_a_billion_pixels_is_refused_before_decoding():
    """A PNG whose IHDR says 40000×40000: Pillow's own pixel bound, as an error (not a warning and a 4.8 GB
    allocation)."""
    import struct
    import zlib

    seed = bytearray(_image("png"))
    seed[16:24] = struct.pack(">II", 40000, 40000)
    seed[29:33] = struct.pack(">I", zlib.crc32(bytes(seed[12:29])))  # a valid CRC: only the size is wrong
    out = _read_bytes("img.png", bytes(seed), lambda f: read_images([f], 16))
    assert isinstance(out, TokennetError) and "Decompression" in str(out), out


def test_a_wav_header_with_an_inflated_sample_rate_is_refused():
    """Found by the fuzzing: a rate of ~2**31 Hz in the header made resampling design a 320 GiB filter."""
    import struct

    seed = bytearray(_audio("PCM_16", "wav"))
    seed[24:32] = struct.pack("<II", 2**31 - 1, 2 * (2**31 - 1))  # the fmt chunk's sample rate and byte rate
    out = _read_bytes("pcm16.wav", bytes(seed), lambda f: load_audio(f, 16000))
    assert isinstance(out, TokennetError) and "sample rate" in str(out), out


def test_an_npy_header_promising_more_than_the_file_holds_is_refused():
    seed = _image("npy").replace(b"(16, 16, 3)", b"(99999999, 16, 3)")
    out = _read_bytes("img.npy", seed, lambda f: read_images([f], 16))
    assert isinstance(out, TokennetError) and "truncated" in str(out), out


# -- graph JSON ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph_seed(tmp_path_factory):
    from tokennet.data.graphs import marked_distance_set
    from tokennet.tasks.graph import write_graphs

    batch, _ = marked_distance_set(2, 0)
    return json.loads(write_graphs(batch, tmp_path_factory.mktemp("g") / "g.json").read_text())


def _graphs(f: Path):
    """What ``GraphPrediction.batch`` does with a ``--graphs`` file: read, check, collate (positions included)."""
    from tokennet.tasks.graph import read_graphs
    from tokennet.tokens.graph import collate_graphs

    graphs = read_graphs(f, node_features=2)
    return collate_graphs([(g["x"], g["edges"]) for g in graphs], k=8, rw_steps=8, max_distance=8)


@FUZZ
@given(data=st.data())
def test_damaged_graph_json_is_one_line(graph_seed, data):
    if data.draw(st.booleans(), label="structural"):
        damaged = data.draw(mutated_json(graph_seed), label="mutation").data
    else:
        seed = json.dumps(graph_seed).encode()
        damaged = data.draw(mutated(seed, hot=len(seed)), label="mutation").data
    _read_bytes("graphs.json", damaged, _graphs)


@FUZZ
@given(case=oversized_graphs())
def test_graph_files_past_the_bounds_are_one_line_naming_the_bound(case):
    """Issue 44: a graph of 20,000 nodes took minutes and gigabytes; now every graph file past a bound (nodes,
    edges, node pairs of the file, nesting) is refused before any tensor is built, naming the file and the bound."""
    text, bound = case
    out = _read_bytes("graphs.json", text.encode(), _graphs)
    if bound is None:
        assert not isinstance(out, TokennetError), out
    else:
        assert isinstance(out, TokennetError) and bound in str(out), out


# -- chat JSONL ------------------------------------------------------------------------------------------------------
CHATS = [{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]},
         {"messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": "how are you"},
                       {"role": "assistant", "content": "fine"}]}]


@pytest.fixture(scope="module")
def chat_tokenizer():
    return train_tokenizer("char", "hello there how are you fine thanks be nice <|im_start|>user assistant system\n")


def test_the_seed_chats_read(chat_tokenizer):
    out = _read_bytes("chats.jsonl", "".join(json.dumps(c) + "\n" for c in CHATS).encode(),
                      lambda f: read_chats(f, chat_tokenizer))
    assert not isinstance(out, TokennetError), out


@FUZZ
@given(data=st.data())
def test_damaged_chat_jsonl_is_one_line(chat_tokenizer, data):
    """Bytes damaged anywhere, or one record's JSON given a wrong value (a role that is a number, content a list,
    no messages, nesting 100,000 deep)."""
    lines = [json.dumps(c).encode() for c in CHATS]
    if data.draw(st.booleans(), label="structural"):
        i = data.draw(st.integers(0, len(lines) - 1), label="line")
        lines[i] = data.draw(mutated_json(CHATS[i]), label="mutation").data
        damaged = b"\n".join(lines) + b"\n"
    else:
        seed = b"\n".join(lines) + b"\n"
        damaged = data.draw(mutated(seed, hot=len(seed)), label="mutation").data
    _read_bytes("chats.jsonl", damaged, lambda f: read_chats(f, chat_tokenizer))


# -- VQA answers.tsv -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def question_dir(tmp_path_factory):
    from tokennet.data.vqa import write_question_dir

    return write_question_dir(tmp_path_factory.mktemp("vqa") / "q", 8)


def _questions(src: Path, tsv: bytes):
    """``read_question_dir`` of a copy of ``src`` whose ``answers.tsv`` holds ``tsv`` (its cache cleared: the copy
    is a new directory, but a reader must not answer from a stale read)."""
    from tokennet.data.vqa import read_question_dir

    d = Path(tempfile.mkdtemp(prefix="vqa-fuzz-")) / "q"
    try:
        shutil.copytree(src, d)
        f = d / "answers.tsv"
        f.write_bytes(tsv)
        read_question_dir.cache_clear()
        return check_reader(lambda: read_question_dir(str(d)), f, *sorted((d / "images").iterdir()))
    finally:
        shutil.rmtree(d.parent)


@FUZZ
@given(data=st.data())
def test_damaged_answers_tsv_is_one_line(question_dir, data):
    seed = (question_dir / "answers.tsv").read_bytes()
    _questions(question_dir, data.draw(mutated(seed, hot=len(seed)), label="mutation").data)


def test_an_answers_field_past_the_csv_limit_is_one_line(question_dir):
    """Found by the fuzzing: a field longer than the csv module's limit (128 KiB) raised csv.Error."""
    head, first, *rest = (question_dir / "answers.tsv").read_text().splitlines()
    first = first.replace("\t", "\t" + "x" * 200_000 + " ", 1)
    out = _questions(question_dir, "\n".join([head, first, *rest]).encode())
    assert isinstance(out, TokennetError) and "answers.tsv" in str(out), out


def test_cli_train_vqa_on_a_damaged_answers_file_is_one_line(question_dir, tmp_path):
    d = tmp_path / "q"
    shutil.copytree(question_dir, d)
    f = d / "answers.tsv"
    for damaged in (f.read_bytes()[:30], b"image\tquestion\tanswer\n" + b"a\tb\n", b"\xff\xfe" * 10):
        f.write_bytes(damaged)
        code, err = check_cli(["-q", "train", "vqa", "--data", str(d), "--out", str(tmp_path / "run"),
                               "--max-iters", "1"], f)
        assert code == 2 and "answers.tsv" in err, err
        assert not (tmp_path / "run" / "run.json").exists()


@st.composite
def escaping_rows(draw) -> tuple[str, str]:
    """How an answers.tsv row's image can leave its directory: ``(kind, the path the row names)``; ``kind`` "inside"
    is a path with ``..`` that stays inside (it must read)."""
    kind = draw(st.sampled_from(["dotdot", "absolute", "symlink", "symlinked dir", "inside"]))
    up = "../" * draw(st.integers(1, 6))
    return kind, {"dotdot": draw(st.sampled_from([up + "outside.png", "images/../" + up + "outside.png",
                                                   "./" + up + "q/images/../../outside.png"])),
                  "absolute": draw(st.sampled_from(["OUTSIDE", "/etc/passwd", "/dev/zero", "/proc/self/environ"])),
                  "symlink": "images/link.png", "symlinked dir": "elsewhere/outside.png",
                  "inside": "images/../images/" + draw(st.sampled_from(["00000.png", "00001.png"]))}[kind]


@FUZZ
@given(case=escaping_rows(), data=st.data())
def test_answers_rows_escaping_the_directory_are_one_line_naming_the_row(question_dir, case, data):
    """Issue 44: answers.tsv could name any image on disk; a row whose image leaves the directory that holds it (by
    ``..``, an absolute path or a symbolic link) is refused before any image is read, naming the row."""
    from tokennet.data.vqa import read_question_dir

    kind, name = case
    root = Path(tempfile.mkdtemp(prefix="vqa-escape-"))
    try:
        d = root / "q"
        shutil.copytree(question_dir, d)
        outside = root / "outside.png"
        shutil.copy(d / "images" / "00000.png", outside)  # a readable image: only its place is wrong
        if kind == "symlink":
            (d / "images" / "link.png").symlink_to(outside)
        elif kind == "symlinked dir":
            (d / "elsewhere").symlink_to(root, target_is_directory=True)
        f = d / "answers.tsv"
        lines = f.read_text().splitlines()
        row = data.draw(st.integers(1, len(lines) - 1), label="row")
        lines[row] = "\t".join([name.replace("OUTSIDE", str(outside)), *lines[row].split("\t")[1:]])
        f.write_text("\n".join(lines) + "\n")
        read_question_dir.cache_clear()
        out = check_reader(lambda: read_question_dir(str(d)), f, outside)
        if kind == "inside":
            assert not isinstance(out, TokennetError), out
        else:
            assert isinstance(out, TokennetError) and f"line {row + 1}" in str(out) and "outside" in str(out), out
    finally:
        shutil.rmtree(root)
