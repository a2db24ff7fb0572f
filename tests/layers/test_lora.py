"""LoRA: adapters start at the base model, train alone, merge exactly, resume exactly, refuse a foreign base."""

import pytest
import torch
from support import crash_and_resume

from tokennet.errors import ConfigError, DataError
from tokennet.layers.lora import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    base_sha256,
    load_adapter,
    lora_layers,
    merge_lora,
    save_adapter,
    strip_lora,
)
from tokennet.models import create_model
from tokennet.train import TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
V = 24


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return create_model("gpt-micro", vocab_size=V, block_size=16, **kw)


def _randomize_b(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_layers(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g, dtype=m.lora_B.dtype))


class Walk:
    """Sequences ``x_{t+1} = x_t + step (mod V)`` from random starts: batch ``i`` is a pure function of ``i``."""

    def __init__(self, step, batch_size=16, T=16, seed=0):
        self.step, self.B, self.T, self.seed = step, batch_size, T, seed

    def batch(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start = torch.randint(V, (self.B, 1), generator=g)
        seq = (start + self.step * torch.arange(self.T + 1)) % V  # (B, T + 1)
        return seq[:, :-1], seq[:, 1:]


def _val_loss(model, source, n=4):
    model.eval()
    with torch.no_grad():
        loss = sum(float(model(*source.batch(-(i + 1))).loss) for i in range(n)) / n
    model.train()
    return loss


def _train(model, source, out, steps, lr):
    cfg = TrainConfig(max_iters=steps, warmup_iters=0, eval_interval=0, log_interval=0, progress=False, lr=lr,
                      weight_decay=0.0, report=False)
    t = Trainer(model, cfg, source, out_dir=out)
    t.fit()
    return t


def test_adapter_starts_at_the_base_and_only_adapters_train():
    m = _model(num_kv_heads=2, gated_mlp=True, activation="silu")
    x = torch.randint(V, (2, 16))
    ref = m(x).logits
    apply_lora(m, LoRAConfig(rank=4, targets="attn,mlp"))
    assert torch.equal(m(x).logits, ref)  # B = 0: the adapted model is the base model
    names = {n.rsplit(".", 1)[-1] for n in lora_layers(m)}
    assert names == {"qkv_proj", "out_proj", "fc1", "fc2", "gate"}
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    qkv = m.decoder.blocks[0].attn.qkv_proj
    assert isinstance(qkv, LoRALinear) and qkv.splits == [64, 32, 32]  # q, k, v (2 of 4 heads for k/v)
    assert qkv.lora_A.shape == (3 * 4, 64) and qkv.lora_B.shape == (128, 4)


def test_optimizer_keeps_state_for_the_adapters_only(tmp_path):
    m = apply_lora(_model(), LoRAConfig(rank=2))
    t = _train(m, Walk(1), tmp_path / "r", steps=2, lr=1e-3)
    held = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in m.named_parameters() if n.endswith(("lora_A", "lora_B"))}
    assert held == adapters and set(map(id, t.optimizer.state)) == adapters


def test_merged_weight_is_base_plus_scaled_ba():
    m = _model(num_kv_heads=2).double()
    base = {n: p.clone() for n, p in m.named_parameters()}
    apply_lora(m, LoRAConfig(rank=3, alpha=5.0))
    _randomize_b(m)
    layers = {n: (l.lora_A.clone(), l.lora_B.clone(), l.splits) for n, l in lora_layers(m).items()}
    x = torch.randint(V, (2, 16))
    adapted = m(x).logits
    merge_lora(m)
    params = dict(m.named_parameters())
    for name, (A, B, splits) in layers.items():
        r = A.shape[0] // len(splits)
        # The plain formula, map by map: W_s + (α/r) B_s A_s.
        want = torch.cat([w + (5.0 / 3) * b @ a for w, b, a in
                          zip(base[f"{name}.weight"].split(splits), B.split(splits), A.split(r))])
        torch.testing.assert_close(params[f"{name}.weight"], want, rtol=0, atol=1e-13)
    assert not lora_layers(m) and all(p.requires_grad for p in m.parameters())
    torch.testing.assert_close(m(x).logits, adapted, rtol=0, atol=1e-10)


def test_strip_gives_back_the_base():
    m = _model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    apply_lora(m, LoRAConfig(rank=2))
    _randomize_b(m)
    strip_lora(m)
    after = m.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_lora_lowers_validation_loss_on_a_shifted_task(tmp_path):
    """A base trained on steps of +1 learns steps of +3 through rank-4 adapters alone."""
    base = _model()
    _train(base, Walk(1), tmp_path / "base", steps=150, lr=3e-3)
    shifted = Walk(3, seed=1)
    before = _val_loss(base, shifted)
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    apply_lora(base, LoRAConfig(rank=4, alpha=8.0))
    _train(base, shifted, tmp_path / "lora", steps=100, lr=1e-2)
    after = _val_loss(base, shifted)
    assert after < 0.5 * before, (before, after)
    sd = base.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in frozen.items())  # the base did not move


def _lora_setup(tmp_path, name):
    m = apply_lora(_model(), LoRAConfig(rank=2, dropout=0.1))  # dropout: the RNG must resume too
    cfg = TrainConfig(max_iters=8, warmup_iters=2, eval_interval=4, log_interval=2, progress=False, lr=3e-3,
                      report=False)
    return Trainer(m, cfg, Walk(2), out_dir=tmp_path / name)


def test_lora_resume_is_bitwise_exact(tmp_path):
    a, c = crash_and_resume(_lora_setup, tmp_path)
    c.fit()
    sa, sc = a.model.state_dict(), c.model.state_dict()
    assert sa.keys() == sc.keys()
    for k in sa:
        assert torch.equal(sa[k], sc[k]), k
    assert any(k.endswith("lora_B") and sa[k].abs().sum() > 0 for k in sa)  # the adapters did train


def test_adapter_round_trip_and_refusal_on_another_base(tmp_path):
    m = _model()
    sha = base_sha256(m)
    cfg = LoRAConfig(rank=2, alpha=4.0, targets=("qkv_proj",))
    apply_lora(m, cfg)
    assert base_sha256(m) == sha  # adapting does not change the base's checksum
    _randomize_b(m)
    x = torch.randint(V, (2, 16))
    want = m(x).logits
    path = save_adapter(m, tmp_path / "adapter.safetensors", cfg)
    fresh = _model()
    assert load_adapter(fresh, path) == cfg
    assert torch.equal(fresh(x).logits, want)
    other = _model(seed=1)
    with pytest.raises(DataError, match="trained on base weights"):
        load_adapter(other, path)
    assert not lora_layers(other)  # refused before anything changed


def test_bad_targets_and_ranks_are_one_line_errors():
    with pytest.raises(ConfigError, match="'q_proj' names no linear layer"):
        apply_lora(_model(), LoRAConfig(targets="q_proj"))
    with pytest.raises(ConfigError, match="names no linear layer"):
        apply_lora(_model(), LoRAConfig(targets="attn,nonsense"))
    with pytest.raises(ConfigError, match=r"lora_rank=40 is larger than .*qkv_proj allows \(min\(in, out\) = 16\)"):
        apply_lora(_model(num_kv_heads=1), LoRAConfig(rank=40))  # k and v have 16 rows each
    with pytest.raises(ConfigError, match="lora_rank must be a positive integer"):
        LoRAConfig(rank=0)
    with pytest.raises(ConfigError, match="lora_dropout"):
        LoRAConfig(dropout=1.0)
    m = _model()
    apply_lora(m, LoRAConfig(rank=2))
    with pytest.raises(ConfigError, match="already has LoRA adapters"):
        apply_lora(m, LoRAConfig(rank=2))
