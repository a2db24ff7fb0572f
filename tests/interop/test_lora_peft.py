"""LoRA against Hugging Face peft: the same tiny Llama, the same adapters, the same batches → the same losses.

A random ``transformers`` Llama is saved and imported into tokennet (:func:`~tokennet.interop.init.load_init`);
both sides get adapters of the same rank and α on q, k, v, o, gate, up and down (tokennet's ``attn,mlp``: its
stacked ``qkv_proj`` holds one adapter per map, as peft's three layers do), with the same ``A`` and ``B``
copied across (``B`` non-zero, so the adapters act from the first step), dropout 0. Then each trains with
``torch.optim.AdamW`` and gradient clipping on the same batches; the per-step losses agree in float32.
"""

import pytest
import torch
import torch.nn.functional as F

from tokennet.interop.init import load_init
from tokennet.layers.lora import LoRAConfig, apply_lora, lora_layers

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.usefixtures("one_thread")

HF_OF = {"qkv_proj": ("self_attn", ["q_proj", "k_proj", "v_proj"]), "out_proj": ("self_attn", ["o_proj"]),
         "gate": ("mlp", ["gate_proj"]), "fc1": ("mlp", ["up_proj"]), "fc2": ("mlp", ["down_proj"])}
RANK, ALPHA, VOCAB, T = 4, 8.0, 64, 16


def _pair(tmp_path, randomized, *, fused: bool):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = randomized(transformers.LlamaForCausalLM(cfg)).float()
    hf.save_pretrained(tmp_path / "hf")
    hf.config.use_cache = False
    theirs = peft.get_peft_model(hf, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                                                     target_modules=[p for _, ps in HF_OF.values() for p in ps],
                                                     task_type="CAUSAL_LM")).train()
    ours = apply_lora(load_init(tmp_path / "hf").model, LoRAConfig(rank=RANK, alpha=ALPHA, targets="attn,mlp"))
    ours.train()
    hf_layers = theirs.base_model.model.model.layers
    g = torch.Generator().manual_seed(1)
    copied = 0
    with torch.no_grad():
        for name, layer in lora_layers(ours).items():
            layer.fused = fused
            i, leaf = int(name.split(".")[2]), name.rsplit(".", 1)[-1]  # decoder.blocks.<i>.attn.qkv_proj
            group, parts = HF_OF[leaf]
            A, B = [], []
            for part in parts:
                lin = getattr(getattr(hf_layers[i], group), part)
                a = (torch.rand(RANK, lin.in_features, generator=g) * 2 - 1) / lin.in_features ** 0.5
                b = torch.randn(lin.out_features, RANK, generator=g) * 0.05
                lin.lora_A["default"].weight.copy_(a)
                lin.lora_B["default"].weight.copy_(b)
                A.append(a)
                B.append(b)
                copied += 1
            layer.lora_A.copy_(torch.cat(A))  # (S·r, K): [A_q; A_k; A_v]
            layer.lora_B.copy_(torch.cat(B))  # (N, r): B_q, B_k, B_v on their maps' rows
    assert copied == 2 * 7
    return ours, theirs


def _train(loss_of, params, batches):
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for x, y in batches:
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fused", [True, False])
def test_lora_trains_the_same_losses_as_peft_on_the_same_batches(tmp_path, randomized, fused):
    ours, theirs = _pair(tmp_path, randomized, fused=fused)
    n_ours = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    n_theirs = sum(p.numel() for p in theirs.parameters() if p.requires_grad)
    assert n_ours == n_theirs  # the same adapters, nothing else trains
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(VOCAB, (6, 3, T + 1), generator=g)
    batches = [(b[:, :-1], b[:, 1:]) for b in ids]
    with torch.no_grad():  # the same function before training
        x, _ = batches[0]
        torch.testing.assert_close(ours(x).logits, theirs(input_ids=x).logits, rtol=1e-5, atol=1e-5)
    got = _train(lambda x, y: ours(x, y).loss, [p for p in ours.parameters() if p.requires_grad], batches)
    want = _train(lambda x, y: F.cross_entropy(theirs(input_ids=x).logits.flatten(0, 1), y.flatten()),
                  [p for p in theirs.parameters() if p.requires_grad], batches)
    assert want[-1] < want[0] - 0.05  # it trains: the comparison is not of constant losses
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=2e-5)
    # And the adapters ended where peft's did (B of the query map of layer 0).
    b_q = theirs.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    got_b = lora_layers(ours)["decoder.blocks.0.attn.qkv_proj"].lora_B[: b_q.shape[0]]
    torch.testing.assert_close(got_b, b_q.detach(), rtol=1e-4, atol=1e-5)
