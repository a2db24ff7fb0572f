"""Lecture ideas that ``docs/lecture_audit.md`` found without a test: each checks one statement of the three lecture
documents (``/work/shared/lecture/``) against the module that implements it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tokennet.attention.multihead import MultiHeadAttention
from tokennet.layers import Block
from tokennet.models import create_model
from tokennet.position import sinusoidal_table

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def test_scores_are_the_bilinear_form_of_W_q_and_W_k_and_not_symmetric():
    """notes.txt: "Relevance is measured under the learned maps: q_aᵀ k_b = aᵀ W_qᵀ W_k b, which is not symmetric.
    So 'A attends to B' is distinct from 'B attends to A'"."""
    torch.manual_seed(0)
    N, D = 5, 8
    attn = MultiHeadAttention(D, 1, bias=False, backend="math").eval()
    x = torch.randn(1, N, D)
    W_q, W_k, _ = attn.qkv_proj.weight.split(D)  # nn.Linear stores W with q = W t
    S = x[0] @ W_q.T @ W_k @ x[0].T / math.sqrt(D)  # S[a, b] = aᵀ W_qᵀ W_k b / √D
    _, A = attn(x, return_weights=True)
    torch.testing.assert_close(A[0, 0], torch.softmax(S, -1))
    assert (S - S.T).abs().max() > 0.1  # a attends to b ≠ b attends to a
    # The asymmetry comes from W_q ≠ W_k: with one matrix for both the scores are symmetric.
    attn.qkv_proj.weight[D:2 * D] = W_q
    _, A_tied = attn(x, return_weights=True)
    S_tied = torch.log(A_tied[0, 0])  # log-softmax: S up to a per-row constant
    S_tied = S_tied - S_tied.mean(-1, keepdim=True)
    S_sym = x[0] @ W_q.T @ W_q @ x[0].T / math.sqrt(D)
    torch.testing.assert_close(S_tied, S_sym - S_sym.mean(-1, keepdim=True), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S_sym, S_sym.T)


@torch.no_grad()
def test_token_norm_gives_each_token_zero_mean_and_unit_variance():
    """transcript.txt: "token norm ... more commonly called in the literature LayerNorm ... this operation is just
    taking the vector and normalizing it to have zero mean and unit variance"."""
    torch.manual_seed(0)
    blk = Block(16, 4)
    x = torch.randn(2, 7, 16) * torch.rand(2, 7, 1) * 10 + torch.randn(2, 7, 1) * 5  # each token its own scale
    y = blk.norm1(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 7), atol=1e-3, rtol=0)
    torch.testing.assert_close(blk.norm1(x[:, 3:4]), y[:, 3:4])  # per token: the others do not enter


def test_sinusoidal_frequencies_decrease_along_the_encoding_dimension():
    """attention-notes.txt: "In binary representations, a higher bit has a lower frequency than a lower bit.
    Similarly, positional encoding decreases frequencies along encoding dimension"."""
    n, dim = 2000, 16
    pe = sinusoidal_table(n, dim, dtype=torch.float64)
    sine = pe[1:, 0::2]  # column 2j of each pair, from position 1 (every sine is 0 at position 0)
    crossings = ((sine[1:] > 0) != (sine[:-1] > 0)).sum(0).tolist()  # sign changes over the positions
    nonzero = [c for c in crossings if c > 0]
    assert len(nonzero) >= 4 and all(a > b for a, b in zip(nonzero, nonzero[1:], strict=False))
    assert crossings == sorted(crossings, reverse=True)
    for j, c in enumerate(crossings[:3]):  # the crossings count ω_j n / π, ω_j = 10000^(−2j/D)
        assert c == pytest.approx(10000 ** (-2 * j / dim) * n / math.pi, rel=0.02, abs=1)
    # The binary analogy: bit b of i changes every 2^b numbers, so lower bits change more often.
    flips = [sum(((i >> b) & 1) != (((i + 1) >> b) & 1) for i in range(255)) for b in range(8)]
    assert flips == sorted(flips, reverse=True) and flips[0] == 255


@torch.no_grad()
def test_vit_blocks_normalize_before_attention_and_mlp_and_use_gelu():
    """attention-notes.txt: ViT's MLP "Activation function uses the GELU"; "Normalization is applied right before the
    multi-head attention or MLP (not after as in vanilla Transformer)"."""
    torch.manual_seed(0)
    m = create_model("vit-micro").eval()
    x = torch.randn(2, 5, m.config.dim)
    for blk in m.encoder.layers():
        assert isinstance(blk.mlp.act, nn.GELU)
        mlp = lambda t, f=blk.mlp: f.fc2(nn.functional.gelu(f.fc1(t)))  # noqa: E731
        h = x + blk.attn(blk.norm1(x))
        torch.testing.assert_close(blk(x), h + mlp(blk.norm2(h)), atol=1e-5, rtol=1e-5)
        post = blk.norm2((y := blk.norm1(x + blk.attn(x))) + mlp(y))  # the vanilla Transformer's order
        assert not torch.allclose(blk(x), post, atol=1e-3)


def _randomized(model: nn.Module) -> nn.Module:
    """Every weight drawn at random (N(0, 0.5²)), so that no output is near zero by the initialization."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


@torch.no_grad()
def test_vit_with_positions_is_not_translation_invariant_and_without_is():
    """attention-notes.txt: Transformers "lack useful principles in convolution, such as translation invariance":
    a ViT with positions changes its answer when the image moves by one patch; without positions (mean pooled) a
    cyclic move of whole patches only permutes the tokens, so the answer stays, but a move by half a patch does
    not."""
    plain = _randomized(create_model("vit-micro", position="none", pool="mean"))
    x = plain.example_input(1)  # (1, 3, 16, 16): 4 × 4 patches of 4 pixels
    moved = torch.roll(x, shifts=4, dims=-1)  # one patch to the right (cyclic)
    torch.testing.assert_close(plain(moved).logits, plain(x).logits, rtol=1e-4, atol=1e-5)
    with_pos = _randomized(create_model("vit-micro", pool="mean"))  # learned positions, random like the rest
    assert (with_pos(moved).logits - with_pos(x).logits).abs().max() > 0.02
    # Without positions, only moves by whole patches are free: half a patch changes what each patch holds.
    assert (plain(torch.roll(x, shifts=2, dims=-1)).logits - plain(x).logits).abs().max() > 0.02


def test_every_domain_runs_the_same_transformer_block():
    """transcript.txt: "The recipe is once you turn your data into a set of tokens, then you just use a transformer
    ... First, the domain expert turns data into tokens, and then generic transformer processes tokens"."""
    families = {"vit-micro": {}, "ast-digits": {}, "gpt-micro": {}, "graph-micro": {"node_features": 3},
                "sphere-micro": {}, "seq2seq-micro": {}, "captioner-micro": {}}
    for name, kw in families.items():  # images, audio, text, graphs, the sphere, translation, captions
        m = create_model(name, **kw)
        blocks = [mod for mod in m.modules() if isinstance(mod, Block)]
        assert blocks, f"{name} has no tokennet.layers.Block"
        assert all(type(b) is Block and isinstance(b.attn, MultiHeadAttention) for b in blocks), name


@torch.no_grad()
def test_coordinate_channels_break_the_cnns_translation_equivariance():
    """transcript: "convolution has this nice property of translation equivariance, conv of trans x is trans of conv
    x" and "if we want convolutional networks to not be translation equivariant, we tell the filter where I am in
    the image". The vqa CNN's trunk, without and with two coordinate channels (``readout="coords"``): move the
    picture by two of the trunk's units (8 pixels) and, away from the borders the padding touches, the plain trunk's
    map moves with it exactly as far; the trunk that is told where it is answers differently there."""
    from tokennet.models.vqa import VQACNN, VQACNNConfig

    def trunk_maps(readout: str) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        cfg = VQACNNConfig(arch="plain", widths=[8], depths=[2], stem_kernel=4, stem_stride=4, norm="none",
                           image_size=32, readout=readout)
        model = VQACNN(cfg).eval()
        images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        question = torch.tensor([[1, 2, 3]])
        moved = torch.roll(images, shifts=8, dims=-1)  # 8 px = 2 units of the stride-4 stem, to the right
        return model.forward_features((images, question)), model.forward_features((moved, question))

    plain, plain_moved = trunk_maps("mean")
    # columns 3..5 of the moved map hold what columns 1..3 held; a 2-layer 3×3 trunk sees ±2 units, so these
    # columns' fields touch neither the padding nor the pixels the roll wrapped around
    assert plain.shape[-1] == 8
    torch.testing.assert_close(plain_moved[..., 2:-2, 4:6], plain[..., 2:-2, 2:4], rtol=1e-5, atol=1e-6)
    told, told_moved = trunk_maps("coords")
    assert (told_moved[..., 2:-2, 4:6] - told[..., 2:-2, 2:4]).abs().max() > 1e-2


class _ScoreWork(torch.utils._python_dispatch.TorchDispatchMode):
    """The arithmetic a score function does: multiply-adds of its matrix products, one operation per element
    written by anything else that computes (adds, tanh, scaling), and the largest tensor it makes."""

    PRODUCTS = {"mm", "bmm"}
    ELEMENTWISE = {"add", "mul", "tanh", "div"}

    def __init__(self):
        super().__init__()
        self.multiply_adds = self.elementwise = self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.PRODUCTS:
            a, b = args[0], args[1]
            self.multiply_adds += a.numel() * b.shape[-1]  # (…, M, K) @ (…, K, N): M·K·N per batch entry
        elif name in self.ELEMENTWISE:
            self.elementwise += out.numel()
        if isinstance(out, torch.Tensor) and name not in {"view", "_unsafe_view", "unsqueeze", "expand",
                                                           "transpose", "t", "squeeze", "permute", "detach"}:
            self.largest = max(self.largest, out.numel())
        return out


@torch.no_grad()
def test_dot_product_scores_do_less_work_than_additive_ones():
    """attention-notes: scaled dot-product attention is "more computationally efficient but requires both query and
    key having the same vector of length". For ``n`` queries and keys of width ``d`` (additive: hidden width ``d``
    too), counted op by op: the dot product is one ``n × d × n`` product (``n²d`` multiply-adds, ``n²`` scaled);
    additive attention adds every query to every key (``n²d``), takes ``tanh`` of all of it (``n²d``), then reduces
    it with ``w_v`` (``n²d`` multiply-adds) after projecting both sides (``2nd²``) — about three times the work,
    and an ``n × n × d`` tensor where the dot product's largest is ``n × n``."""
    from tokennet.attention.scores import AdditiveScore, DotProductScore

    n, d = 64, 32
    q, k = torch.randn(1, n, d), torch.randn(1, n, d)
    counts = {}
    for name, score in (("dot", DotProductScore()), ("additive", AdditiveScore(d, d, d))):
        with _ScoreWork() as work:
            assert score(q, k).shape == (1, n, n)
        counts[name] = work
    dot, additive = counts["dot"], counts["additive"]
    assert (dot.multiply_adds, dot.elementwise, dot.largest) == (n * n * d, n * n, n * n)
    assert additive.multiply_adds == n * n * d + 2 * n * d * d and additive.elementwise >= 2 * n * n * d
    assert additive.largest == n * n * d
    assert additive.multiply_adds + additive.elementwise > 3 * (dot.multiply_adds + dot.elementwise)


def test_layernorm_makes_the_weight_updates_independent_of_the_activations_scale():
    """transcript: "normalizing activations will have a consequence on changing the size of the weight updates.
    Because if I backprop through normalizing the activations, you can see that the weight update will be a
    function of the scale of the activations." A pre-norm block's sublayers read ``LayerNorm(x)``, the same for
    ``x`` and ``10 x``: for the same gradient on their outputs, the weights' gradients are the same. Without the
    norms (``norm="none"``) the same sublayers' weight gradients grow with the activations' scale."""

    def grads(norm: str, scale: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        block = Block(16, 4, norm=norm).double()
        x = scale * torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        direction = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        # each sublayer on its own, as the block applies it to the residual stream: f(norm(x))
        outputs = block.attn(block.norm1(x)) + block.mlp(block.norm2(x))
        (outputs * direction).sum().backward()
        return {name: p.grad.clone() for name, p in block.named_parameters() if "norm" not in name}

    normed, normed_big = grads("pre", 1.0), grads("pre", 10.0)
    for name in normed:  # equal up to LayerNorm's eps (1e-5 against a variance of about 1): measured ~1e-5
        assert (normed_big[name] - normed[name]).norm() <= 1e-4 * normed[name].norm(), name
    bare, bare_big = grads("none", 1.0), grads("none", 10.0)
    for name in ("attn.qkv_proj.weight", "attn.out_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"):
        assert bare_big[name].norm() > 9.9 * bare[name].norm(), name  # measured 11x to 46x


@torch.no_grad()
def test_a_query_computed_by_an_mlp_picks_keys_no_linear_query_can():
    """transcript: the query function "is just a linear projection of the token vector … But it could be other
    functions … It could be an MLP". Two keys, A and B, and a question ``x ∈ {0, 1}²``: attend to A exactly when
    ``x₁ XOR x₂``. With a linear query the score difference ``s_A − s_B`` is affine in ``x``, so
    ``f(0,0) + f(1,1) = f(0,1) + f(1,0)`` and the XOR pattern of signs is impossible; a cross-attention layer with
    ``query_mlp=2`` (``Q = GELU(x W₁ + b₁) W₂ + b₂``), weights set by hand, does it — and its output is the
    formula's ``softmax(Q Kᵀ / √E) V``."""
    questions = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]).unsqueeze(1)  # (4, 1, 2)
    keys = torch.eye(2).expand(4, 2, 2)  # (4, 2, 2): key A = (1, 0), key B = (0, 1)

    def weight_on_a(layer: MultiHeadAttention) -> torch.Tensor:
        for proj in (layer.kv_proj, layer.out_proj):  # K = V = the context, the output = the weights on A and B
            proj.weight.copy_(torch.eye(2).repeat(proj.weight.shape[0] // 2, 1))
            proj.bias.zero_()
        out = layer(questions, keys)[:, 0]  # (4, 2)
        q = layer.project_q(questions)[:, 0]  # (4, 2)
        torch.testing.assert_close(out, torch.softmax(q @ torch.eye(2) / math.sqrt(2), -1), rtol=1e-5, atol=1e-6)
        return out[:, 0]

    torch.manual_seed(0)
    linear = MultiHeadAttention(2, 1, context_dim=2)
    score_gap = torch.logit(weight_on_a(linear).double())  # s_A − s_B (up to 1/√E)
    torch.testing.assert_close(score_gap[0] + score_gap[3], score_gap[1] + score_gap[2], rtol=1e-4, atol=1e-4)

    mlp = MultiHeadAttention(2, 1, context_dim=2, query_mlp=2)
    first, second = mlp.q_proj[0], mlp.q_proj[2]
    first.weight.copy_(torch.full((2, 2), 10.0))  # h = GELU(10 s), GELU(10 (s − 1)) with s = x₁ + x₂
    first.bias.copy_(torch.tensor([0.0, -10.0]))
    second.weight.copy_(torch.tensor([[1.0, -2.0], [-1.0, 2.0]]))  # h₁ − 2 h₂ = 10 · XOR, then centred
    second.bias.copy_(torch.tensor([-5.0, 5.0]))
    on_a = weight_on_a(mlp)
    assert on_a[1] > 0.99 and on_a[2] > 0.99 and on_a[0] < 0.01 and on_a[3] < 0.01
    with pytest.raises(ValueError, match="cross-attention"):
        MultiHeadAttention(2, 1, query_mlp=2)
