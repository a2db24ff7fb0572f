"""Muon + AdamW parameter groups, the Newton–Schulz step, the WSD schedule, and exact resume with Muon."""

import pytest
import torch
from support import crash_and_resume
from torch import nn

from tokennet.data.text import LMBatches
from tokennet.errors import ConfigError
from tokennet.models import create_model
from tokennet.train import MuonAdamW, TrainConfig, Trainer, configure_optimizer, wsd_lr
from tokennet.train.optim import muon_param_names, newton_schulz, schedule_lr


def _groups(opt):
    return {kind: [p for g in opt.param_groups if g["kind"] == kind for p in g["params"]] for kind in ("muon", "adamw")}


def test_muon_takes_hidden_matrices_only():
    m = create_model("gpt-micro", vocab_size=17, qk_norm=True, tie_weights=False)
    opt = configure_optimizer(m, lr=1e-3, optimizer="muon")
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in m.named_parameters()}
    muon = {names[id(p)] for p in _groups(opt)["muon"]}
    adam = {names[id(p)] for p in _groups(opt)["adamw"]}
    expected = {f"decoder.blocks.{i}.{s}.weight" for i in range(2)
                for s in ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")}
    assert muon == expected
    assert {"tok_emb.weight", "lm_head.weight", "pos_emb.weight"} <= adam  # embeddings and head: AdamW
    assert "decoder.blocks.0.attn.q_norm.weight" in adam and "decoder.norm.weight" in adam
    assert muon.isdisjoint(adam) and muon | adam == set(names.values())
    # AdamW keeps its decay split: matrices decay, gains and biases do not.
    for g in opt.param_groups:
        if g["kind"] == "adamw" and g["weight_decay"] > 0:
            assert all(p.dim() >= 2 for p in g["params"])


def test_tied_head_is_counted_once_and_stays_with_adamw():
    m = create_model("gpt-micro", vocab_size=17)  # lm_head tied to tok_emb
    assert "lm_head.weight" not in muon_param_names(m)
    opt = configure_optimizer(m, lr=1e-3, optimizer="muon")
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == sum(p.numel() for p in m.parameters())


def test_newton_schulz_orthogonalizes():
    g = torch.Generator().manual_seed(0)
    for shape in [(3, 32, 32), (2, 64, 16), (16, 48)]:
        G = torch.randn(*shape, generator=g)
        O = newton_schulz(G, steps=5)
        assert O.shape == G.shape
        s = torch.linalg.svdvals(O)
        s0 = torch.linalg.svdvals(G / G.norm(dim=(-2, -1), keepdim=True))
        # The quintic iteration pushes singular values to ~[0.7, 1.2], not exactly 1 (by design).
        assert s.max() < 1.5 and s.median() > 0.6 and (s.min(-1).values > 3 * s0.min(-1).values).all(), s
    a, b = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
    torch.testing.assert_close(newton_schulz(torch.stack([a, b]))[1], newton_schulz(b), atol=1e-5, rtol=1e-4)


def test_fused_qkv_is_orthogonalized_per_block():
    """A step on [W_q; W_k; W_v] equals three separate Muon steps on W_q, W_k, W_v."""
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=17)
    w = m.decoder.blocks[0].attn.qkv_proj.weight
    grad = torch.randn_like(w)
    opt = configure_optimizer(m, lr=1e-3, optimizer="muon", muon_lr=0.1)
    before = w.detach().clone()
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    w.grad = grad.clone()
    opt.step()
    D = w.shape[1]
    for i in range(3):
        u = grad[i * D:(i + 1) * D] * (1 - 0.95)  # Nesterov mix of G and M = (1−μ) G on the first step
        u = grad[i * D:(i + 1) * D].lerp(u, 0.95)
        expected = before[i * D:(i + 1) * D] - 0.1 * newton_schulz(u)
        torch.testing.assert_close(w[i * D:(i + 1) * D].detach(), expected, atol=1e-5, rtol=1e-4)


def test_adamw_part_matches_torch_adamw():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    ours = MuonAdamW([], [{"params": [a.weight], "weight_decay": 0.1}, {"params": [a.bias], "weight_decay": 0.0}],
                     lr=1e-2, betas=(0.9, 0.99))
    ref = torch.optim.AdamW([{"params": [b.weight], "weight_decay": 0.1}, {"params": [b.bias], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.99))
    for i in range(5):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        for mod, opt in ((a, ours), (b, ref)):
            mod(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(a.weight, b.weight, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(a.bias, b.bias, atol=1e-6, rtol=1e-5)


def test_muon_training_decreases_loss():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=17, block_size=16, activation="relu2", qk_norm=True)
    ids = torch.arange(400) % 17  # a periodic sequence: learnable
    src = LMBatches(ids, 16, 8, seed=0)
    opt = configure_optimizer(m, lr=3e-3, optimizer="muon", muon_lr=0.02)
    losses = []
    for i in range(40):
        x, y = src.batch(i)
        loss = m(x, y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


def _setup(tmp_path, name, **cfg):
    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=17, block_size=8, dropout=0.1, qk_norm=True, activation="relu2")
    ids = torch.randint(17, (500,), generator=torch.Generator().manual_seed(0))
    src = LMBatches(ids, 8, 4, seed=0)
    config = TrainConfig(**{"max_iters": 8, "warmup_iters": 2, "eval_interval": 4, "log_interval": 2,
                            "progress": False, "lr": 3e-3, "optimizer": "muon", "schedule": "wsd",
                            "muon_weight_decay": 0.01, **cfg})
    return Trainer(model, config, src, out_dir=tmp_path / name, tokens_per_batch=32)


def test_resume_with_muon_is_bitwise_exact(tmp_path):
    a, c = crash_and_resume(_setup, tmp_path)
    assert any("momentum_buffer" in s for s in c.optimizer.state.values())  # Muon's state came back
    c.fit()
    for (na, pa), (_, pc) in zip(a.model.state_dict().items(), c.model.state_dict().items(), strict=True):
        assert torch.equal(pa, pc), na
    for sa, sc in zip(a.optimizer.state.values(), c.optimizer.state.values(), strict=True):
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sc[k])), k


def test_muon_lr_follows_schedule(tmp_path):
    t = _setup(tmp_path, "s", max_iters=10, warmup_iters=0, muon_lr=0.05, lr=1e-3, eval_interval=0)
    seen = []
    orig = t.optimizer.step

    def spy(*a, **k):
        seen.append({g["kind"]: g["lr"] for g in t.optimizer.param_groups})
        return orig(*a, **k)

    t.optimizer.step = spy
    t.fit()
    assert seen[0]["muon"] == pytest.approx(0.05) and seen[0]["adamw"] == pytest.approx(1e-3)
    for s in seen:
        assert s["muon"] / s["adamw"] == pytest.approx(50.0)
    assert seen[-1]["adamw"] < 1e-3  # decayed at the end


def test_wsd_schedule_values():
    kw = {"lr": 1.0, "min_lr": 0.1, "warmup_iters": 10, "decay_fraction": 0.2}
    assert wsd_lr(0, 0.0, **kw) == pytest.approx(1 / 11)
    assert wsd_lr(10, 0.0, **kw) == pytest.approx(1.0)
    assert wsd_lr(50, 0.5, **kw) == pytest.approx(1.0)  # stable
    assert wsd_lr(50, 0.8, **kw) == pytest.approx(1.0)  # decay starts at 1 − 0.2
    assert wsd_lr(50, 0.9, **kw) == pytest.approx(0.55)  # halfway down, linearly
    assert wsd_lr(99, 1.0, **kw) == pytest.approx(0.1)
    assert wsd_lr(99, 1.5, **kw) == pytest.approx(0.1)  # clamped past the budget
    assert schedule_lr("wsd", 50, 0.9, **kw) == wsd_lr(50, 0.9, **kw)


@pytest.mark.parametrize("kw", [{"optimizer": "sgd"}, {"schedule": "linear"}, {"muon_lr": 0.0},
                                {"muon_momentum": 1.0}, {"decay_fraction": 0.0}, {"decay_fraction": 1.5},
                                {"muon_weight_decay": -0.1}])
def test_bad_options_raise_clear_errors(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        TrainConfig(**kw)


def test_bad_model_options():
    with pytest.raises(ValueError, match="activation"):
        create_model("gpt-micro", vocab_size=17, activation="relu3")
    with pytest.raises(ValueError, match="qk_norm"):
        create_model("gpt-micro", vocab_size=17, qk_norm="yes")
    with pytest.raises(ValueError, match="qk_norm"):
        create_model("gpt-micro", vocab_size=17, block_size=8, qk_norm=True, mixer="token")
    with pytest.raises(ConfigError, match="optimizer"):
        configure_optimizer(nn.Linear(2, 2), lr=1e-3, optimizer="lion")
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([nn.Parameter(torch.zeros(3))], [])


def test_muon_step_matches_torch_muon():
    """Same update as PyTorch's own ``torch.optim.Muon`` (which orthogonalizes in bf16: loose tolerance)."""
    torch.manual_seed(0)
    w1 = nn.Parameter(torch.randn(32, 16) * 0.1)
    w2 = nn.Parameter(w1.detach().clone())
    ours = MuonAdamW([w1], [], muon_lr=0.02, momentum=0.95)
    ref = torch.optim.Muon([w2], lr=0.02, momentum=0.95, weight_decay=0.0, nesterov=True)
    for i in range(3):
        g = torch.randn(32, 16, generator=torch.Generator().manual_seed(i))
        w1.grad, w2.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(w1, w2, atol=2e-3, rtol=0)
    assert not torch.allclose(w1, torch.zeros_like(w1))
