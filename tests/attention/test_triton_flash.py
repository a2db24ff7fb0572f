"""The Triton kernels of tiled attention equal the plain-math backend: output and gradients of q, k, v.

Run on the CPU through Triton's interpreter, in a child process started with ``TRITON_INTERPRET=1``: Triton
reads that variable when ``triton`` itself is imported (its own library functions are decorated then), and in a
test session something has usually imported it already. The child runs this file as a script and saves the
kernels' outputs and gradients; the tests compare them here with the plain formula. Skipped where Triton is not
installed.

Tolerances. float32: every output and gradient entry is a handful of dot products of length K <= max(N, E) = 33
over terms of size O(1) (standard-normal inputs, scores scaled by 1/√E); the rounding error of such a sum is at
most about K·u·Σ|terms| with u = 2⁻²⁴ ≈ 6e-8 (Higham's γ_K bound), a few 1e-6 for sums of up to ~10 in
magnitude, and both sides round. atol = rtol = 2e-5 sits above that bound; a wrong tile, mask or rescaling moves
entries by O(0.1). float16 (u = 2⁻¹¹ ≈ 4.9e-4): the kernel rounds the probabilities P and dS to half before
their matmuls, as FlashAttention does, so entries differ from a float64 reference by up to a few u times the
largest gradient (≈ 4): atol 1e-2, rtol 1e-2. bfloat16 is not checked here: Triton 3.8's interpreter multiplies
bfloat16 blocks wrongly (a ``tl.dot`` of two bfloat16 16×16 blocks gives ~1e10 on the CPU); bench/gpu.py checks
the bfloat16 kernels against the float32 formula on the GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tokennet.attention.functional import attention
from tokennet.attention.triton_flash import triton_flash_attention, unavailable_reason
from tokennet.errors import ConfigError

F32 = dict(atol=2e-5, rtol=2e-5)
F16 = dict(atol=1e-2, rtol=1e-2)
SMALL = (16, 16, 1, 1)  # 16-row tiles: N = 33 is two whole tiles and a ragged one

# name: (B, H, Nq, Nk, E, dtype, is_causal, kernel config (None: the defaults, one ragged 128/64 tile), strided)
CASES = {
    "f32": (1, 2, 33, 33, 16, "float32", False, SMALL, False),
    "f32_causal": (1, 2, 33, 33, 16, "float32", True, SMALL, False),
    "f32_default_blocks": (1, 2, 33, 33, 16, "float32", False, None, False),
    "f32_causal_default_blocks": (1, 2, 33, 33, 16, "float32", True, None, False),
    # Queries are the last 5 of 33 positions (a prompt continued over a cache): the causal offset is Nk - Nq.
    "f32_fewer_queries": (2, 1, 5, 33, 16, "float32", False, SMALL, False),
    "f32_fewer_queries_causal": (2, 1, 5, 33, 16, "float32", True, SMALL, False),
    # (B, N, H, E) storage seen as (B, H, N, E), as the attention module passes q, k, v; E = 12 pads to 16.
    "f32_strided_e12_causal": (1, 2, 33, 33, 12, "float32", True, SMALL, True),
    "f16_causal": (1, 2, 33, 33, 16, "float16", True, SMALL, False),
}


def _inputs(name: str):
    """The case's q, k, v (leaves, requiring grad) and the output gradient dO, the same in every process."""
    B, H, Nq, Nk, E, dtype, _, _, strided = CASES[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))

    def rand(n):
        if strided:
            return torch.randn(B, n, H, E, generator=g).transpose(1, 2)  # (B, H, n, E), not contiguous
        return torch.randn(B, H, n, E, generator=g)

    q, k, v = rand(Nq), rand(Nk), rand(Nk)
    d_out = torch.randn(B, H, Nq, E, generator=g)
    dt = getattr(torch, dtype)
    return [t.to(dt).requires_grad_() for t in (q, k, v)], d_out.to(dt)


def _emit(path: str) -> None:
    """In the child process (TRITON_INTERPRET=1): every case's kernel output and gradients, saved to ``path``."""
    results = {}
    for name, (*_, is_causal, config, strided) in CASES.items():
        (q, k, v), d_out = _inputs(name)
        assert q.is_contiguous() != strided
        out = triton_flash_attention(q, k, v, is_causal=is_causal, fwd_config=config, bwd_config=config)
        results[name] = [out.detach(), *torch.autograd.grad(out, (q, k, v), d_out)]
    torch.save(results, path)


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    pytest.importorskip("triton", reason="triton is not installed: the Triton attention kernels cannot be checked")
    path = tmp_path_factory.mktemp("triton") / "results.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, str(path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(path)


@pytest.mark.parametrize("name", CASES)
def test_kernels_match_the_formula(name, kernel_results):
    (q, k, v), d_out = _inputs(name)
    is_causal = CASES[name][6]
    # float32 against the float32 formula; float16 against the float64 formula (its own rounding only).
    ref_dtype = torch.float32 if q.dtype == torch.float32 else torch.float64
    tol = F32 if q.dtype == torch.float32 else F16
    leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
    ref = attention(*leaves, is_causal=is_causal, backend="math")
    expected = [ref.detach(), *torch.autograd.grad(ref, leaves, d_out.to(ref_dtype))]
    got = kernel_results[name]
    for what, g, r in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
        assert g.dtype == q.dtype and g.shape == r.shape, what
        torch.testing.assert_close(g.to(ref_dtype), r, **tol, msg=lambda m, what=what: f"{name} {what}: {m}")


def test_refusals_are_one_line_errors(monkeypatch):
    q, k, v = (torch.randn(1, 2, n, 16) for n in (4, 3, 3))
    with pytest.raises(ConfigError, match="fewer keys"):
        triton_flash_attention(q, k, v, is_causal=True)
    with pytest.raises(ConfigError, match="share one of"):
        triton_flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(ConfigError, match="powers of two"):
        triton_flash_attention(q, k, v, fwd_config=(24, 16, 1, 1))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = unavailable_reason("cpu")
    assert reason is not None and ("TRITON_INTERPRET=1" in reason or "not installed" in reason)
    with pytest.raises(ConfigError, match="interpreter|not installed"):
        triton_flash_attention(q, k, v)


if __name__ == "__main__":
    _emit(sys.argv[1])
