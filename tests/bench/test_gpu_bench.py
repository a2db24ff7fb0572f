"""bench/gpu.py on a machine without a GPU: the one-line refusal, the MFU arithmetic, and every section's setup at
a tiny size on the CPU (the model's and the batches' device and dtype, bf16 autocast, the JSON record)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import load_bench

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_bench("gpu")


B = _bench()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "--smoke --device cpu" in lines[0]


def test_peak_table_and_unknown_gpus():
    assert B.peak_bf16("NVIDIA H200")[0] == 989e12
    assert B.peak_bf16("NVIDIA H100 80GB HBM3")[0] == 989e12  # the SXM part's name
    assert B.peak_bf16("NVIDIA A100-SXM4-80GB")[0] == 312e12
    for name in ("NVIDIA H100 PCIe", "NVIDIA GeForce RTX 4090", "Tesla T4"):
        peak, why = B.peak_bf16(name)
        assert peak is None and "MFU not reported" in why and name in why


def test_flops_per_token_of_gpt2_small_matches_nanogpt_count():
    # nanoGPT's GPT-2 small with vocabulary 50304 has 124,475,904 parameters, 123,689,472 without the position
    # table (1024 × 768); 12·L·H·E·T = 12·12·12·64·1024 = 113,246,208.
    with torch.device("meta"):
        model = B.create_model("gpt", **B.GPT2_SMALL)
    assert sum(p.numel() for p in model.parameters()) == 124_475_904
    assert B.flops_per_token(model) == 6 * 123_689_472 + 113_246_208


def test_training_setup_places_model_and_batches_and_autocasts_to_bf16(tmp_path):
    trainer = B.setup_training(B.SMOKE_GPT, "cpu", 3, out_dir=str(tmp_path))
    model = trainer.module
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights; autocast computes in bf16
    x, y = trainer.source.batch(5)
    assert x.shape == y.shape == (3, B.SMOKE_GPT["block_size"]) and x.dtype == torch.long and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(trainer.source.batch(5)[0], x)  # shifted; seeded by i
    assert trainer.c.precision == "bf16"
    with trainer._autocast():
        assert model(x).logits.dtype == torch.bfloat16
    before = [p.detach().clone() for p in model.parameters()]
    loss, _, _ = trainer.train_step()
    assert torch.isfinite(torch.tensor(loss)) and trainer.step == 1
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # the optimizer stepped
    assert list(tmp_path.iterdir()) == []  # a timing run writes nothing into the run directory


def test_smoke_run_end_to_end_writes_the_record(tmp_path):
    out = tmp_path / "gpu.json"
    assert B.main(["--smoke", "--device", "cpu", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["command"] == f"python bench/gpu.py --smoke --device cpu --out {out}"
    assert rec["commit"] and rec["machine"]["torch"] == torch.__version__ and rec["machine"]["gpu"] is None
    s = rec["sections"]
    assert list(s) == ["train", "attention", "decode"]  # no compiled training in a smoke run
    train = s["train"]
    assert train["tokens_per_s"] > 0 and train["steps_timed"] >= 3 and train["device"] == "cpu"
    assert train["flops_per_token"] > 6 * train["params"] * 0.9 and "mfu" not in train  # no GPU: no MFU row
    att = s["attention"]
    assert set(att["timings"]) == {"full_fwd", "full_fwd_bwd", "causal_fwd", "causal_fwd_bwd"}
    for row in att["errors_vs_float32_math"].values():  # float16 inputs (u ≈ 4.9e-4) on O(1) values
        assert row["sdpa"]["out"] < 2e-2 and row["tokennet_flash_pytorch"]["dq"] < 2e-2
    dec = s["decode"]
    assert dec["param_dtype"] == "torch.bfloat16" and set(dec["batches"]) == {"1", "4"}
    assert all(b["tokens_per_s"] > 0 for b in dec["batches"].values())


def test_budget_skips_sections_and_a_failed_section_is_recorded(tmp_path, monkeypatch):
    out = tmp_path / "gpu.json"
    assert B.main(["--smoke", "--device", "cpu", "--out", str(out), "--budget", "0"]) == 0
    assert all("skipped" in r for r in json.loads(out.read_text())["sections"].values())

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (pretend)")

    monkeypatch.setattr(B, "section_decode", broken)
    assert B.main(["--smoke", "--device", "cpu", "--out", str(out), "--sections", "decode"]) == 1
    assert json.loads(out.read_text())["sections"]["decode"]["error"] == "RuntimeError: CUDA out of memory (pretend)"
