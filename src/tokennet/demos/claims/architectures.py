"""Claims 9 and 10: CNN, RNN and self-attention compared, and the long experiments read from their benches.

The table of claim 9 is measured here (FLOPs counted by PyTorch's ``FlopCounterMode``, sequential steps counted
as the calls that must run one after another, path lengths found by gradient reach as the lecture's x1 … x7
test finds them). Claim 9's long-input sweep and claims 10 and 10b take minutes: they are read from
``bench/results/rnn_forgets.json``, ``bench/results/vit_vs_cnn.json`` and ``bench/results/deit-digits.json`` when
those exist.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ... import jsonio
from ...attention.multihead import MultiHeadAttention
from ._registry import Result, claim, plt, png

__all__ = ["RNNLayer", "layer_table", "bench_results_dir", "read_bench_claim"]


class RNNLayer(nn.Module):
    """A recurrent layer, ``h_t = tanh(W_x x_t + W_h h_{t−1})``, one cell call per token (they cannot overlap)."""

    def __init__(self, dim: int):
        super().__init__()
        self.w_x = nn.Linear(dim, dim, bias=False)
        self.w_h = nn.Linear(dim, dim, bias=False)
        self.calls = 0

    def cell(self, x_t: Tensor, h: Tensor) -> Tensor:
        self.calls += 1
        return torch.tanh(self.w_x(x_t) + self.w_h(h))

    def forward(self, x: Tensor, *, cut: int | None = None) -> Tensor:
        """``(B, n, D) → (B, n, D)``; ``cut``: detach the state after that step (to find the gradient's path)."""
        state = x.new_zeros(x.shape[0], x.shape[2])
        out = []
        for t in range(x.shape[1]):
            state = self.cell(x[:, t], state)
            if t == cut:
                state = state.detach()
            out.append(state)
        return torch.stack(out, dim=1)  # (B, n, D)


def _conv(dim: int, k: int) -> nn.Module:
    conv = nn.Conv1d(dim, dim, k, padding=k // 2, bias=False)
    return _Tokens(conv)


class _Tokens(nn.Module):
    """A Conv1d on tokens ``(B, n, D)`` (it takes ``(B, D, n)``)."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        self.conv = conv

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class _ChainDepth(TorchDispatchMode):
    """Counts the sequential steps of a forward: the longest chain of operators each needing another's output
    (an operator's depth is one more than its inputs' deepest)."""

    def __init__(self):
        super().__init__()
        self.depth: dict[int, tuple[Tensor, int]] = {}  # id → (tensor kept alive so ids stay unique, depth)
        self.max = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [arg for arg in tree_flatten((args, kwargs))[0] if isinstance(arg, Tensor)]
        depth = 1 + max((self.depth[id(arg)][1] for arg in ins if id(arg) in self.depth), default=0)
        for item in tree_flatten(out)[0]:
            if isinstance(item, Tensor):
                self.depth[id(item)] = (item, depth)
        self.max = max(self.max, depth)
        return out


def _chain_depth(layer: nn.Module, x: Tensor) -> int:
    with torch.no_grad(), _ChainDepth() as mode:
        layer(x)
    return mode.max


def _flops(layer: nn.Module, x: Tensor) -> int:
    # imported here: torch.utils.flop_counter loads Triton (~77 MB resident, ~1 s), and this module is imported
    # by every `tokennet.load` through the plugin registry
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(x)
    return int(counter.get_total_flops())


def _reach(layer: nn.Module, n: int, dim: int) -> Tensor:
    """``R[i, j]``: output token ``i`` of one layer has a non-zero gradient with respect to input token ``j``."""
    x = torch.randn(1, n, dim, requires_grad=True)
    y = layer(x)[0].sum(-1)  # (n,)
    rows = [torch.autograd.grad(y[i], x, retain_graph=True)[0][0].abs().sum(-1) != 0 for i in range(n)]
    return torch.stack(rows)  # (n, n)


def _stacked_path(reach: Tensor) -> int:
    """The fewest stacked layers (each with reach ``R``) for the last output to see the first input."""
    n = reach.shape[0]
    reached = torch.eye(n, dtype=torch.bool)
    for depth in range(1, n + 1):
        reached = (reach.float() @ reached.float()) > 0  # (n, n): the reach of ``depth`` layers
        if reached[n - 1, 0]:
            return depth
    raise AssertionError("the first input never reaches the last output")


def _rnn_path(rnn: RNNLayer, n: int, dim: int) -> int:
    """The hidden states the gradient from the last output back to the first input must pass: the steps whose
    state, once detached, cuts it."""
    passes = 0
    for cut in range(n - 1):
        x = torch.randn(1, n, dim, requires_grad=True)
        y = rnn(x, cut=cut)[0, -1].sum()
        (grad,) = torch.autograd.grad(y, x, allow_unused=True)
        passes += grad is None or bool((grad[0, 0] == 0).all())
    return passes


def layer_table(seed: int = 0, *, dim: int = 16, k: int = 5, flop_sizes: tuple[int, ...] = (16, 64, 256),
                path_sizes: tuple[int, ...] = (8, 16, 32)) -> dict:
    """Measured cost per layer, sequential steps and maximum path length for a conv, an RNN and self-attention
    layer of width ``dim``, beside the exact counts their formulas give (multiply-adds counted as 2 FLOPs)."""
    torch.manual_seed(seed)
    conv, rnn = _conv(dim, k), RNNLayer(dim)
    attn = MultiHeadAttention(dim, 1, bias=False, backend="math")
    with torch.no_grad():  # positive weights: no gradient vanishes by accident, every path carries one
        for m in (conv, rnn, attn):
            for param in m.parameters():
                param.copy_(param.abs() + 0.01)
    width = dim
    formulas = {"CNN": lambda n: 2 * k * n * width * width, "RNN": lambda n: 2 * 2 * n * width * width,
                "self-attention": lambda n: 2 * 4 * n * width * width + 2 * 2 * n * n * width}
    layers = {"CNN": conv, "RNN": rnn, "self-attention": attn}
    flops = {name: [{"n": n, "measured": _flops(layer, torch.randn(1, n, width)), "formula": formulas[name](n)}
                    for n in flop_sizes] for name, layer in layers.items()}
    steps = {}  # the longest chain of dependent operators; the RNN's is one cell (a few operators) per token
    for name, layer in layers.items():
        rows = [{"n": n, "depth": _chain_depth(layer, torch.randn(1, n, width))} for n in path_sizes]
        per_token = (rows[1]["depth"] - rows[0]["depth"]) / (rows[1]["n"] - rows[0]["n"])  # operators per token
        overhead = rows[0]["depth"] - per_token * rows[0]["n"]
        for row in rows:  # in units of the layer's step: a depth that does not grow → 1 step, else the cells
            row["measured"] = round((row["depth"] - overhead) / per_token) if per_token else 1
            row["formula"] = row["n"] if name == "RNN" else 1
        steps[name] = rows
    half = k // 2
    paths = {"CNN": [], "RNN": [], "self-attention": []}
    for n in path_sizes:
        paths["CNN"].append({"n": n, "measured": _stacked_path(_reach(conv, n, width)),
                             "formula": math.ceil((n - 1) / half)})
        paths["RNN"].append({"n": n, "measured": _rnn_path(rnn, n, width), "formula": n - 1})
        paths["self-attention"].append({"n": n, "measured": _stacked_path(_reach(attn, n, width)), "formula": 1})
    return {"dim": width, "k": k, "flops": flops, "sequential": steps, "path": paths}


# The lecture's table, each entry with the exact count the measurement is held to (multiply-adds as 2 FLOPs).
TABLE_FORMULAS = {"CNN": ("O(k·n·d²): 2knd²", "O(1)", "O(n/k): ⌈(n−1)/⌊k/2⌋⌉"),
                  "RNN": ("O(n·d²): 4nd² (W_x, W_h)", "O(n): n", "O(n): n−1"),
                  "self-attention": ("O(n²·d): 4n²d + 8nd²", "O(1)", "O(1)")}


@claim("cnn-rnn-attention-table", "9")
def claim_table(seed: int = 0) -> Result:
    """"Self-attention enjoys both parallel computation and the shortest maximum path length": a convolution costs
    O(knd²) with O(1) sequential operations and a maximum path length of O(n/k); an RNN O(nd²) with O(n)
    sequential operations and O(n) path length; self-attention O(n²d), O(1) and O(1).

    Each column measured for a layer of width 16 (kernel 3): FLOPs counted by PyTorch's FlopCounterMode, the
    sequential steps counted, the path from the first input to the last output found by gradient reach.
    """
    found = layer_table(seed)
    ok = all(row["measured"] == row["formula"] for part in ("flops", "sequential", "path")
             for rows in found[part].values() for row in rows)
    largest = {name: rows[-1] for name, rows in found["flops"].items()}
    longest = {name: rows[-1] for name, rows in found["path"].items()}
    n_f, n_p = largest["CNN"]["n"], longest["CNN"]["n"]
    # Growth of each cost with n, between the last two sizes: ~1 for CNN and RNN, → 2 for attention.
    growth = {name: math.log(rows[-1]["measured"] / rows[-2]["measured"]) / math.log(rows[-1]["n"] / rows[-2]["n"])
              for name, rows in found["flops"].items()}
    holds = ok and longest["self-attention"]["measured"] == 1 and longest["RNN"]["measured"] == n_p - 1 \
        and growth["self-attention"] > growth["CNN"] + 0.4
    measured = (f"at n={n_f}: FLOPs CNN {largest['CNN']['measured']:,}, RNN {largest['RNN']['measured']:,}, "
                f"attention {largest['self-attention']['measured']:,} (growth exponents {growth['CNN']:.2f}, "
                f"{growth['RNN']:.2f}, {growth['self-attention']:.2f}); sequential steps 1, "
                f"{found['sequential']['RNN'][-1]['measured']}, 1; path at n={n_p}: {longest['CNN']['measured']}, "
                f"{longest['RNN']['measured']}, {longest['self-attention']['measured']}"
                f"; every figure equals its formula's count: {ok}")
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(13, 3.2))
    for ax, part, ylabel in ((axes[0], "flops", "FLOPs per layer"), (axes[1], "sequential", "sequential steps"),
                             (axes[2], "path", "max path length (first input → last output)")):
        for name, rows in found[part].items():
            ax.plot([x["n"] for x in rows], [x["measured"] for x in rows], "o-", label=f"{name} (measured)")
            ax.plot([x["n"] for x in rows], [x["formula"] for x in rows], "k:", lw=0.8)
        ax.set_xscale("log", base=2), ax.set_xlabel("n tokens"), ax.set_ylabel(ylabel), ax.legend(fontsize=7)
        if part == "flops":
            ax.set_yscale("log")
    fig.suptitle("CNN / RNN / self-attention, measured (dots: the formula's count)", fontsize=10)
    table = {name: {"cost": TABLE_FORMULAS[name][0], "sequential": TABLE_FORMULAS[name][1],
                    "path": TABLE_FORMULAS[name][2]} for name in TABLE_FORMULAS}

    def cells(part: str, name: str) -> str:  # a measured figure, and the formula's count where they differ
        return ", ".join(f"{x['measured']:,}" + ("" if x["measured"] == x["formula"] else f" (≠ {x['formula']:,})")
                         for x in found[part][name])

    ns_f = "/".join(str(x["n"]) for x in found["flops"]["CNN"])
    ns_p = "/".join(str(x["n"]) for x in found["path"]["CNN"])
    rows = [["layer", "cost per layer", f"FLOPs measured, n={ns_f}", "sequential steps",
             f"measured, n={ns_p}", "max path length", f"measured (gradient reach), n={ns_p}"]]
    for name, (cost, seq, path) in TABLE_FORMULAS.items():
        rows.append([name, cost, cells("flops", name), seq, cells("sequential", name), path, cells("path", name)])
    return Result(f"one Conv1d (k={found['k']}), one tanh RNN and one attention layer, d={found['dim']}, n in "
                  f"{[x['n'] for x in found['flops']['CNN']]} (FLOPs) and "
                  f"{[x['n'] for x in found['path']['CNN']]} (paths)",
                  measured, holds, png(fig), {**found, "growth": growth, "formulas": table}, table=rows)


# -- the long experiments: read from their benches' results ------------------------------------------------


def bench_results_dir() -> Path | None:
    """``bench/results`` of the repository this package sits in, or ``None`` (an installed package has none)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "bench").is_dir():
            return parent / "bench" / "results"
    return None


def read_bench_claim(file: str, script: str, *, results_dir: Path | None = None) -> Result:
    """A claim measured by a bench: its ``"claim"`` record from ``results_dir / file`` when that exists, else
    a result that says how to measure it (``holds=None``)."""
    results = results_dir if results_dir is not None else bench_results_dir()
    path = results / file if results is not None else None
    if path is None or not path.is_file():
        return Result(f"not measured here: run python bench/{script}", "not measured here", None,
                      data={"file": f"bench/results/{file}"})
    try:
        record = jsonio.load(path)  # JSONTooDeep is a ValueError
        bench_claim = record["claim"]
        holds = bench_claim["holds"]
        if holds not in (True, False, None):
            raise ValueError(f"holds must be true, false or null, got {holds!r}")
        measured, run = str(bench_claim["measured"]), str(bench_claim["run"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return Result(f"bench/results/{file} is unreadable ({type(err).__name__}: {err}); run python bench/{script}",
                      "not measured here", None, data={"file": f"bench/results/{file}"})
    commit = str(record.get("commit", "unknown"))
    machine = record.get("machine", "unknown")
    machine = machine if isinstance(machine, str) else json.dumps(machine, sort_keys=True)
    source = f"from bench/results/{file}, measured at commit {commit[:12]}"
    figure = None
    picture = path.with_suffix(".png")  # the bench's figure, when it drew one beside its JSON
    if picture.is_file():
        figure = picture.read_bytes()
    return Result(run, measured, holds, figure, {"file": f"bench/results/{file}", "command": record.get("command"),
                                                   "commit": commit, "machine": machine}, source)


@claim("rnn-forgets-long-inputs", "9b")
def claim_rnn_forgets(seed: int = 0) -> Result:
    """An RNN encoder–decoder is "incapable to remember long sentences because of the fixed-length context vector
    ... often causing early parts of the sequence to be forgotten by the time processing completes. The attention
    mechanism was born to resolve this problem."

    Exact match against input length for a GRU without attention, a GRU with Bahdanau attention and a Transformer,
    on inputs longer than the training lengths: read from the bench that trains them (minutes).
    """
    return read_bench_claim("rnn_forgets.json", "rnn_forgets.py")


@claim("vit-vs-cnn-data", "10")
def claim_vit_vs_cnn(seed: int = 0) -> Result:
    """"For small datasets like ImageNet (1.2M images), vision Transformer does not outperform the ResNet ...
    However, the picture changes when training larger models on larger datasets."

    A ViT and a CNN, each trained to convergence at each training-set size: read from the bench that trains them.
    """
    return read_bench_claim("vit_vs_cnn.json", "vit_vs_cnn.py")


@claim("deit-data-efficient", "10b")
def claim_deit(seed: int = 0) -> Result:
    """"It was shown to be effective with data-efficient training strategies of DeiT (Touvron et al., 2021)."

    The plain ViT against DeiT (its augmentation, and a distillation token learning from a CNN teacher trained on
    the same images) on nested subsets of the training images: read from the bench that trains them (minutes).
    """
    return read_bench_claim("deit-digits.json", "deit.py")
