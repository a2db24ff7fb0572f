"""Claims 1–3: the layers as linear maps on the N·D numbers of a token matrix ``T`` (N rows, D columns).

Every map here is written out as an explicit matrix acting on ``vec(T)``, the rows of ``T`` one after the other
(index ``i·D + d`` for token ``i``, dimension ``d``), by applying the layer to each basis vector.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...attention.multihead import MultiHeadAttention
from ...layers.mixer import TokenMixing
from ...layers.mlp import MLP
from ._registry import Result, claim, plt, png

__all__ = ["explicit_matrix", "linear_family", "token_combination_rank", "mlp_as_conv1x1"]


def explicit_matrix(f, N: int, D: int) -> Tensor:
    """The ``(N·D, N·D)`` matrix ``M`` of a linear map ``f: (1, N, D) → (1, N, D)``, ``vec(f(T)) = M vec(T)``."""
    eye = torch.eye(N * D)
    cols = [f(eye[j].view(1, N, D)).reshape(N * D) for j in range(N * D)]  # column j: the image of e_j
    return torch.stack(cols, dim=1)  # (N·D, N·D)


def _shift(t: Tensor) -> Tensor:
    """Translate the tokens by one place (cyclically): ``(B, N, D)``."""
    return torch.roll(t, 1, dims=1)


@torch.no_grad()
def linear_family(seed: int = 0, *, N: int = 6, D: int = 2, k: int = 3,
                  sizes: tuple[int, ...] = (4, 16, 64, 256), count_dim: int = 8) -> dict:
    """Dense, convolution and attention as explicit ``(N·D × N·D)`` matrices, their translation test, and the
    parameter counts of each module (bias-free) as N grows at width ``count_dim``."""
    rng = torch.Generator().manual_seed(seed)
    dense = nn.Linear(N * D, N * D, bias=False)
    conv = nn.Conv1d(D, D, k, padding=k // 2, padding_mode="circular", bias=False)
    attn = MultiHeadAttention(D, 1, bias=False, value_proj=False)  # W_v = I, as the lecture draws it
    for m in (dense, conv, attn):
        for param in m.parameters():
            param.copy_(torch.randn(param.shape, generator=rng) * 0.5)
    with torch.no_grad():
        attn.out_proj.weight.copy_(torch.eye(D))  # W_o = I too: the mixing alone, A ⊗ I_D
    f_dense = lambda t: dense(t.reshape(1, N * D)).view(1, N, D)  # noqa: E731
    f_conv = lambda t: conv(t.transpose(1, 2)).transpose(1, 2)  # noqa: E731 -- (1, D, N) for Conv1d
    T = torch.randn(1, N, D, generator=rng)
    _, A = attn(T, return_weights=True)  # A (1, 1, N, N): computed from T, then held fixed
    f_attn = lambda t: A[0, 0] @ t  # noqa: E731 -- the layer at this input: T_out = A T
    M_dense, M_conv, M_attn = (explicit_matrix(lin_map, N, D) for lin_map in (f_dense, f_conv, f_attn))
    kron = torch.kron(A[0, 0], torch.eye(D))  # (N·D, N·D): A ⊗ I_D
    x = torch.randn(1, N, D, generator=rng)
    err = {name: float((lin_map(_shift(x)) - _shift(lin_map(x))).abs().max()) for name, lin_map in
           (("dense", f_dense), ("conv", f_conv))}
    blocks = M_conv.view(N, D, N, D).permute(0, 2, 1, 3)  # (N, N, D, D): block (i, j) maps token j to i
    toeplitz = max(float((blocks[i, j] - blocks[(i + 1) % N, (j + 1) % N]).abs().max())
                   for i in range(N) for j in range(N))
    counts = []
    for n in sizes:
        width = count_dim
        counts.append({
            "N": n,
            "dense": nn.Linear(n * width, n * width, bias=False).weight.numel(),
            "conv": nn.Conv1d(width, width, k, bias=False).weight.numel(),
            "attention": sum(param.numel() for param in MultiHeadAttention(width, 1, bias=False).parameters()),
            "learned_A": TokenMixing(width, n, free=True).W.numel(),
        })
    return {"N": N, "D": D, "k": k, "matrices": {"dense": M_dense, "conv": M_conv, "attention": M_attn},
            "attention_is_A_kron_I": float((M_attn - kron).abs().max()),
            "attention_layer_error": float((M_attn @ T.reshape(-1) - attn(T).reshape(-1)).abs().max()),
            "shift_error": err, "toeplitz_error": toeplitz, "counts": counts, "count_dim": count_dim}


@claim("linear-family", "1")
def claim_linear_family(seed: int = 0) -> Result:
    """"We can now think of a family of different linear combinations of neurons": the fully connected layer
    ("n squared learnable parameters"), convolution (a matrix with "this Toeplitz structure, where the diagonals
    all share the same value", with "translation equivariance, conv of trans x is trans of conv x") and
    attention ("just like this low-rank sparse transformation").

    Each is built as an explicit (N·D × N·D) matrix from its module; the convolution's commutes with a
    translation, the dense one's does not; attention at a given input is ``A ⊗ I_D``; the parameter counts are
    N²D², kD² and a constant 3D² (+ D² for W_o), against N² if A itself were learned.
    """
    res = linear_family(seed)
    first, last = res["counts"][0], res["counts"][-1]
    holds = (res["shift_error"]["conv"] < 1e-5 and res["shift_error"]["dense"] > 1e-2 and res["toeplitz_error"] < 1e-6
             and res["attention_is_A_kron_I"] < 1e-6 and res["attention_layer_error"] < 1e-5
             and last["dense"] == (last["N"] * res["count_dim"]) ** 2 and first["conv"] == last["conv"]
             and first["attention"] == last["attention"] and last["learned_A"] == last["N"] ** 2)
    dim = res["count_dim"]
    measured = (f"shift error conv {res['shift_error']['conv']:.1e} vs dense {res['shift_error']['dense']:.2f}; "
                f"attention = A⊗I_D to {res['attention_is_A_kron_I']:.0e}; params at D={dim}, "
                f"N={first['N']}→{last['N']}: dense {first['dense']:,}→{last['dense']:,}, "
                f"conv {first['conv']}→{last['conv']}, attention {first['attention']}→{last['attention']}, "
                f"learned A {first['learned_A']}→{last['learned_A']}")
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 4, figsize=(15, 3.6))
    for ax, (name, M) in zip(axes[:3], res["matrices"].items(), strict=True):
        lim = float(M.abs().max())
        ax.imshow(M.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(f"{name}: ({res['N']}·{res['D']})² matrix", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    ax = axes[3]
    sizes = [row["N"] for row in res["counts"]]
    for key, label in (("dense", "dense N²D²"), ("conv", "conv kD²"), ("attention", "attention 4D² (W_q,W_k,W_v,W_o)"),
                       ("learned_A", "learned A: N²")):
        ax.loglog(sizes, [row[key] for row in res["counts"]], "o-", label=label)
    ax.set_xlabel("N tokens"), ax.set_ylabel(f"parameters (D = {dim})")
    ax.legend(fontsize=7)
    fig.suptitle("One family of linear maps on N·D numbers", fontsize=10)
    data = {k: v for k, v in res.items() if k != "matrices"}
    return Result(f"explicit matrices of Linear, Conv1d (k={res['k']}, circular) and attention at N={res['N']}, "
                  f"D={res['D']}; a one-token shift; module parameter counts for N in {sizes}",
                  measured, holds, png(fig), data)


@torch.no_grad()
def token_combination_rank(seed: int = 0, *, N: int = 3, D: int = 4) -> dict:
    """The lecture's example: 3 tokens of 4 dimensions (12 neurons). A token combination ``wᵀ T`` gives output
    neuron ``d`` the weights ``U = w e_dᵀ`` over the (N, D) neurons (rank 1, N free numbers); a linear
    combination of neurons has any ``U`` (N·D free numbers, rank up to min(N, D))."""
    rng = torch.Generator().manual_seed(seed)
    weights = torch.randn(N, generator=rng)

    def token_combination(t: Tensor, w: Tensor) -> Tensor:  # (N, D) → (D,): wᵀ T
        return w @ t

    # Output neuron d's weights over the 12 neurons: the gradient of (wᵀ T)_d with respect to T.
    U_tok = torch.autograd.functional.jacobian(lambda t: token_combination(t, weights)[0], torch.randn(N, D))  # (N, D)
    U_neu = torch.randn(N, D, generator=rng)  # a linear combination of the 12 neurons
    # Free numbers: the rank of the map from the parameters to the weights over all neurons and outputs.
    jac = torch.autograd.functional.jacobian(  # (D·N·D, N)
        lambda w_row: torch.kron(w_row[None], torch.eye(D)).reshape(-1), weights)
    sv_neu = torch.linalg.svdvals(U_neu)
    residual = float((sv_neu[1:] ** 2).sum() / (sv_neu ** 2).sum())  # best rank-1 fit (Eckart–Young)
    return {"N": N, "D": D, "neurons": N * D, "token_weights": int(torch.linalg.matrix_rank(jac)),
            "neuron_weights": U_neu.numel(), "rank_token": int(torch.linalg.matrix_rank(U_tok)),
            "rank_neuron": int(torch.linalg.matrix_rank(U_neu)), "rank1_residual": residual,
            "U_tok": U_tok, "U_neu": U_neu}


@claim("low-rank", "2")
def claim_low_rank(seed: int = 0) -> Result:
    """"The token linear combination is less expressive than if I did the same thing over all the individual
    neurons that make up those tokens. It's like a low rank transformation over the neurons, because I only have
    three weights that determine that combination, but I actually have 12 neurons."

    Three tokens of four dimensions: the free numbers of a token combination (the rank of its parameter map) and
    the rank of one output neuron's weights over the 12 neurons, against a random combination of neurons.
    """
    res = token_combination_rank(seed)
    holds = res["token_weights"] == res["N"] and res["neuron_weights"] == res["neurons"] and res["rank_token"] == 1 \
        and res["rank_neuron"] == min(res["N"], res["D"]) and res["rank1_residual"] > 0.05
    measured = (f"{res['token_weights']} free weights vs {res['neuron_weights']}; an output neuron's weights over the "
                f"{res['N']}×{res['D']} neurons have rank {res['rank_token']} vs {res['rank_neuron']}; "
                f"the best rank-1 fit of a neuron combination misses {res['rank1_residual']:.0%} of it")
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(7, 2.6))
    for ax, key, title in ((axes[0], "U_tok", f"token combination: rank {res['rank_token']}"),
                           (axes[1], "U_neu", f"neuron combination: rank {res['rank_neuron']}")):
        lim = float(res[key].abs().max())
        ax.imshow(res[key].numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(title, fontsize=9), ax.set_xlabel("dimension d"), ax.set_ylabel("token i")
    fig.suptitle("One output neuron's weights over 3 tokens × 4 dimensions", fontsize=10)
    data = {k: v for k, v in res.items() if not k.startswith("U_")}
    return Result("wᵀT for 3 tokens of 4 dims vs a random linear combination of the 12 neurons", measured, holds,
                  png(fig), data)


@torch.no_grad()
def mlp_as_conv1x1(seed: int = 0, *, N: int = 10, D: int = 8, mlp_ratio: float = 2.0) -> dict:
    """tokennet's token-wise :class:`MLP` against two 1×1 ``Conv1d`` layers holding the same weights."""
    torch.manual_seed(seed)
    mlp = MLP(D, mlp_ratio=mlp_ratio)
    H = mlp.fc1.out_features
    conv_in, conv_out = nn.Conv1d(D, H, 1), nn.Conv1d(H, D, 1)
    for conv, linear in ((conv_in, mlp.fc1), (conv_out, mlp.fc2)):
        conv.weight.copy_(linear.weight[:, :, None])  # (out, in) → (out, in, 1): a kernel of width 1
        conv.bias.copy_(linear.bias)
    conv = nn.Sequential(conv_in, mlp.act, conv_out)
    x = torch.randn(4, N, D)
    y_mlp = mlp(x)
    y_conv = conv(x.transpose(1, 2)).transpose(1, 2)  # Conv1d takes (B, D, N)
    with torch.enable_grad():  # token i's output against token j's input: zero unless i = j
        t = torch.randn(1, N, D, requires_grad=True)
        jac = torch.autograd.functional.jacobian(lambda t: mlp(t)[0], t)[:, :, 0]  # (N, D, N, D)
    cross = jac.abs().sum(dim=(1, 3))  # (N, N)
    off = float((cross - torch.diag(torch.diag(cross))).abs().max())
    perm = torch.randperm(N)
    return {"max_abs_difference": float((y_mlp - y_conv).abs().max()),
            "mlp_params": sum(param.numel() for param in mlp.parameters()),
            "conv_params": sum(param.numel() for param in conv.parameters()),
            "cross_token_gradient": off, "diag": cross.diag(),
            "permutation_error": float((mlp(x[:, perm]) - y_mlp[:, perm]).abs().max()), "N": N, "D": D,
            "hidden": H}


@claim("mlp-is-conv1x1", "3")
def claim_mlp_conv(seed: int = 0) -> Result:
    """"You can also think of this operation as equivalent to a convolutional filter that is run across the
    sequence of tokens. It's a 1 by 1 convolutional filter ... something that operates on each token
    independently and identically."

    tokennet's MLP and two 1×1 convolutions with its weights: equal outputs, the same parameters, and no
    gradient from one token's output to another token's input.
    """
    res = mlp_as_conv1x1(seed)
    holds = res["max_abs_difference"] < 1e-5 and res["mlp_params"] == res["conv_params"] \
        and res["cross_token_gradient"] == 0.0 and res["permutation_error"] < 1e-6
    measured = (f"max |MLP − conv1×1| = {res['max_abs_difference']:.1e}; {res['mlp_params']} = {res['conv_params']} "
                f"parameters; cross-token gradient {res['cross_token_gradient']:.0f}")
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(3.6, 3.2))
    jac = torch.zeros(res["N"], res["N"])
    jac[range(res["N"]), range(res["N"])] = res["diag"]
    ax.imshow(jac.numpy(), cmap="Greys")
    ax.set_title("Σ|∂ out_i / ∂ in_j|: token-wise", fontsize=9), ax.set_xlabel("input token j")
    ax.set_ylabel("output token i")
    data = {k: v for k, v in res.items() if k != "diag"}
    return Result(f"MLP({res['D']}→{res['hidden']}→{res['D']}) vs Conv1d(k=1)·GELU·Conv1d(k=1) with copied weights on "
                  f"4×{res['N']} tokens", measured, holds, png(fig), data)
