"""LoRA: adapters start at the base model, train alone (beside the modules trained in full), merge exactly, resume
exactly, refuse a foreign base."""

import pytest
import torch
from support import assert_same_function, crash_and_resume

from tokennet.errors import ConfigError, DataError
from tokennet.interop.init import modules_of, with_num_classes
from tokennet.layers.lora import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    base_sha256,
    load_adapter,
    lora_layers,
    lora_state_dict,
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


def _lora_setup(tmp_path, name, modules_to_save=()):
    m = apply_lora(_model(), LoRAConfig(rank=2, dropout=0.1, modules_to_save=modules_to_save))  # dropout: the RNG
    cfg = TrainConfig(max_iters=8, warmup_iters=2, eval_interval=4, log_interval=2, progress=False, lr=3e-3,
                      report=False)
    return Trainer(m, cfg, Walk(2), out_dir=tmp_path / name)


@pytest.mark.parametrize("modules_to_save", [(), ("decoder.norm",)])
def test_lora_resume_is_bitwise_exact(tmp_path, modules_to_save):
    a, c = crash_and_resume(lambda t, n: _lora_setup(t, n, modules_to_save), tmp_path)
    c.fit()
    sa, sc = a.model.state_dict(), c.model.state_dict()
    assert sa.keys() == sc.keys()
    for k in sa:
        assert torch.equal(sa[k], sc[k]), k
    assert any(k.endswith("lora_B") and sa[k].abs().sum() > 0 for k in sa)  # the adapters did train
    if modules_to_save:  # the module trained in full did train (its weight starts at ones)
        assert not torch.equal(sa["decoder.norm.weight"], torch.ones_like(sa["decoder.norm.weight"]))


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
    assert_same_function(fresh(x).logits, want)  # the adapter read from its file: other memory, other kernels
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


# -- modules trained in full beside the adapters (peft's modules_to_save): a classifier's new head ------------
class Blobs:
    """Images of K classes, each a fixed random template plus noise: batch ``i`` is a pure function of ``i``."""

    def __init__(self, k, batch_size=32, seed=0):
        self.k, self.B, self.seed = k, batch_size, seed
        self.templates = torch.randn(k, 3, 16, 16, generator=torch.Generator().manual_seed(99))

    def batch(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        y = torch.randint(self.k, (self.B,), generator=g)
        return self.templates[y] + 0.5 * torch.randn(self.B, 3, 16, 16, generator=g), y


def _vit_with_new_head(k=3, seed=0, head_seed=5):
    torch.manual_seed(seed)
    base = create_model("vit-micro", num_classes=10)
    torch.manual_seed(head_seed)
    model, fresh = with_num_classes(base, k)
    return model, modules_of(fresh)


def test_a_new_head_trains_in_full_beside_the_adapters_and_the_base_stays_frozen(tmp_path):
    m, new = _vit_with_new_head()
    assert new == ("head.fc",)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    apply_lora(m, LoRAConfig(rank=2, targets="attn,mlp,fc", modules_to_save=new))
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert {n for n in trainable if not n.endswith(("lora_A", "lora_B"))} == {"head.fc.weight", "head.fc.bias"}
    assert type(m.head.fc) is torch.nn.Linear  # no adapter inside a module trained in full ("fc" targets it)
    t = _train(m, Blobs(3), tmp_path / "r", steps=5, lr=1e-2)
    held = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in m.parameters() if p.requires_grad}
    assert id(m.head.fc.weight) in held and id(m.head.fc.bias) in held
    after = m.state_dict()
    for k, v in before.items():
        if k.startswith("head.fc."):
            assert not torch.equal(after[k], v), k  # the head trained
        else:
            assert torch.equal(after[k], v), k  # the base did not move


def test_a_trained_new_head_learns_far_more_than_adapters_against_a_frozen_one(tmp_path):
    """The same adapters, steps and data: with the new head frozen at its initialization they can only bend the
    features towards a random projection; trained with them, the loss falls much further."""
    losses = {}
    for name, save in (("frozen", ()), ("trained", ("head.fc",))):
        m, _ = _vit_with_new_head()
        apply_lora(m, LoRAConfig(rank=2, modules_to_save=save))
        _train(m, Blobs(3), tmp_path / name, steps=30, lr=1e-2)
        losses[name] = _val_loss(m, Blobs(3, seed=1))
    assert losses["trained"] < 0.5 * losses["frozen"], losses


def test_the_adapter_file_holds_the_new_head_and_loads_onto_any_head_of_its_shape(tmp_path):
    m, new = _vit_with_new_head()
    cfg = LoRAConfig(rank=2, alpha=4.0, modules_to_save=new)
    apply_lora(m, cfg)
    _randomize_b(m)
    with torch.no_grad():
        m.head.fc.weight.normal_()  # a head unlike any fresh initialization
    x = torch.randn(2, 3, 16, 16)
    m.eval()
    want = m(x).logits
    path = save_adapter(m, tmp_path / "adapter.safetensors", cfg)
    stored = lora_state_dict(m, cfg)
    assert {"head.fc.weight", "head.fc.bias"} <= set(stored)
    from safetensors.torch import load_file

    assert set(load_file(str(path))) == set(stored)
    base, _ = _vit_with_new_head(head_seed=6)  # the same base, another random head: the file replaces it
    assert base_sha256(base, cfg) == base_sha256(m, cfg) and base_sha256(base) != base_sha256(m)
    assert load_adapter(base, path) == cfg
    assert torch.equal(base.eval()(x).logits, want)
    merged = merge_lora(base)
    torch.testing.assert_close(merged(x).logits, want, rtol=0, atol=1e-5)
    assert torch.equal(merged.head.fc.weight, m.head.fc.weight)  # the merged model holds the trained head
    other, _ = _vit_with_new_head(seed=1)
    with pytest.raises(DataError, match="trained on base weights"):
        load_adapter(other, path)
    torch.manual_seed(0)
    ten = create_model("vit-micro", num_classes=10)  # the base itself, with its 10-class head
    with pytest.raises(DataError, match=r"head\.fc\.weight: the file holds \(3, 32\), the model \(10, 32\)"):
        load_adapter(ten, path)
    assert not lora_layers(ten)


def test_modules_to_save_must_name_untied_modules():
    with pytest.raises(ConfigError, match="'nowhere' names no module"):
        apply_lora(_model(), LoRAConfig(rank=2, modules_to_save="nowhere"))
    with pytest.raises(ConfigError, match="lm_head shares a parameter with tok_emb.weight"):
        apply_lora(_model(), LoRAConfig(rank=2, modules_to_save="lm_head"))  # tied to the embedding
    m, _ = _vit_with_new_head()
    with pytest.raises(ConfigError, match=r"trained in full \(head\.fc\); nothing to adapt"):
        apply_lora(m, LoRAConfig(rank=2, targets="fc", modules_to_save="fc"))
    assert LoRAConfig(modules_to_save="head, head.fc").modules_to_save == ("head", "head.fc")
    m, _ = _vit_with_new_head()
    apply_lora(m, LoRAConfig(rank=2, modules_to_save=("head", "head.fc")))  # the outer one holds the inner
    assert {n for n, p in m.named_parameters() if p.requires_grad and "lora" not in n} == {
        "head.norm.weight", "head.norm.bias", "head.fc.weight", "head.fc.bias"}


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("splits,bias", [(None, True), ([8, 4, 4], False)])
def test_fused_lora_equals_the_two_gemm_path_in_value_and_gradients(splits, bias, bf16):
    """The one-node layer (update and ∂x accumulated in place) gives autograd's output and ∂x, ∂A, ∂B. Under bf16
    autocast (``--set precision=bf16``; it once failed there: an in-place product of a bf16 output with a float32
    adapter) both run their products in bf16: the output in bf16, the gradients in float32, close (the sums in
    another order)."""
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 16, bias=bias)
    got = []
    for fused in (True, False):
        lin = LoRALinear(base, rank=3, alpha=6.0, splits=splits, fused=fused)
        torch.manual_seed(1)
        with torch.no_grad():
            lin.lora_A.normal_()
            lin.lora_B.normal_()
        x = torch.randn(2, 5, 12, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = lin(x)
        assert y.dtype == (torch.bfloat16 if bf16 else torch.float32)
        (y.float() * torch.linspace(-1, 1, 16)).sum().backward()
        assert x.grad.dtype == lin.lora_A.grad.dtype == lin.lora_B.grad.dtype == torch.float32
        got.append((y.detach().float(), x.grad, lin.lora_A.grad, lin.lora_B.grad))
        assert lin.weight is base.weight and not base.weight.requires_grad and base.weight.grad is None
    for a, b in zip(*got, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2 if bf16 else 1e-5, atol=5e-2 if bf16 else 1e-5)


def test_fused_lora_under_autocast_casts_its_frozen_weight_once_and_follows_every_change():
    """Under bf16 autocast the fused layer keeps the bf16 copy of its frozen weight across calls, and makes a new
    one when the weight is loaded, replaced (``.data =``) or written in place."""
    torch.manual_seed(0)
    lin = LoRALinear(torch.nn.Linear(8, 6), rank=2, alpha=4.0)
    with torch.no_grad():
        lin.lora_B.normal_()
    x = torch.randn(3, 8)

    def check():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = lin(x)
            want = torch.nn.functional.linear(x, lin.weight + lin.delta_weight(), lin.bias)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        return lin.__dict__["_cast_weight"][2]

    first = check()
    assert check() is first  # kept while the weight is unchanged
    lin.load_state_dict({**lin.state_dict(), "weight": torch.randn(6, 8)})
    assert check() is not first
    lin.weight.data = torch.randn(6, 8) * 3
    check()
    with torch.no_grad():
        lin.weight.mul_(-1)  # in place: the version counter moves
    check()
    assert set(lin.state_dict()) == {"weight", "bias", "lora_A", "lora_B"}
    lin(x)  # no autocast: the float32 weight itself
    assert lin(x).dtype == torch.float32


def test_fused_lora_follows_a_weight_replaced_or_moved():
    """The fused layer reads the weight it holds at each call: loading, ``.to()`` or ``.data =`` leave nothing stale."""
    torch.manual_seed(0)
    lin = LoRALinear(torch.nn.Linear(8, 6), rank=2, alpha=4.0)
    with torch.no_grad():
        lin.lora_B.normal_()
    x = torch.randn(3, 8)
    lin(x)
    ref = lambda m: torch.nn.functional.linear(x.to(m.weight.dtype), m.weight + m.delta_weight(), m.bias)  # noqa: E731
    lin.load_state_dict({**lin.state_dict(), "weight": torch.randn(6, 8)})
    torch.testing.assert_close(lin(x), ref(lin))
    lin.weight.data = torch.randn(6, 8)
    torch.testing.assert_close(lin(x), ref(lin))
    lin.double()
    torch.testing.assert_close(lin(x.double()), ref(lin))
    assert set(lin.state_dict()) == {"weight", "bias", "lora_A", "lora_B"}
