"""GPT: a decoder-only causal transformer language model (Radford et al. 2018/2019).

Reads top to bottom like the paper: token embedding (+ absolute positions) → L pre-norm blocks of
causal masked self-attention and MLP → final LayerNorm → LM head, ``p(x_{t+1} | x_{≤t}) =
softmax(h_t W_eᵀ)`` when the head is tied to the embedding (Press & Wolf 2017).

The same class is Llama (RMSNorm, SwiGLU, RoPE) and Gemma 3 (Gemma Team 2025, https://arxiv.org/abs/2503.19786)
by configuration: Gemma's embeddings are scaled, ``x_0 = √D · E[ids]``; its blocks are sandwich-normed,
``x ← x + N'(Attn(N(x)))`` with RMSNorm's gain ``1 + w`` (``norm_layer="rmsnorm1p"``, ``norm_placement="sandwich"``),
queries and keys RMS-normalized per head (``qk_norm``), a GeGLU MLP ``W₂ (GELU_tanh(W_g x) ⊙ W₁ x)``; five of six
layers attend in a sliding window of W keys (``attention_windows``: key j is seen from query i when
``i − W < j ≤ i``) with RoPE base 10⁴ (``rope_local_base``), the sixth globally with base 10⁶ (``rope_base``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import torch
from torch import Tensor, nn

from ..attention.masks import sliding_window, window_band
from ..attention.multihead import KVCache
from ..dropout import Dropout
from ..errors import ConfigError
from ..layers.block import NORM_LAYERS, mlp_kind
from ..layers.blockquant import FORMATS as BLOCK_FORMATS
from ..layers.blockquant import BlockEmbedding, BlockLinear, group_size
from ..layers.cross_entropy import cross_entropy
from ..layers.mlp import ACTIVATIONS
from ..layers.norm import Norm
from ..layers.stack import AttentionMaps, Decoder
from ..position.alibi import ALiBi
from ..position.learned import LearnedPosition
from ..position.rope import RotaryEmbedding
from ..position.sinusoidal import SinusoidalPosition
from .registry import Output, TransformerConfig, register_family, register_preset

__all__ = ["GPTConfig", "GPT", "POSITIONS"]

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")


@dataclass
class GPTConfig(TransformerConfig, defaults=dict(dim=384, num_layers=6, num_heads=6)):
    """Config of :class:`GPT`.

    Args:
        vocab_size: number of token ids.
        block_size: context length (the longest sequence the model is trained on).
        dim, num_layers, num_heads: width D, depth L, heads H.
        num_kv_heads: key/value heads (grouped-query attention); None = num_heads.
        mlp_ratio: MLP width as a multiple of D.
        dropout: dropout everywhere (0 for small data is often fine).
        position: ``"learned"``, ``"sinusoidal"``, ``"rope"`` or ``"alibi"``.
        tie_weights: share the token embedding with the LM head.
        bias: biases in linear layers and LayerNorms.
        mixer: ``"attention"`` or ``"token"`` (the learned token-mixing matrix, for comparison).
        activation: MLP nonlinearity: ``"gelu"`` (erf), ``"gelu_tanh"`` (GPT-2's tanh approximation), ``"relu"``,
            ``"silu"`` or ``"relu2"`` (squared ReLU, Primer / modded-nanogpt).
        norm_eps: the norms' epsilon (GPT-2: 1e-5).
        norm_layer: ``"layernorm"`` (GPT-2) or ``"rmsnorm"`` (Llama).
        gated_mlp: a gated MLP, ``W₂ (σ(W_g x) ⊙ W₁ x)``: SwiGLU with ``activation="silu"`` (Llama).
        rope_base: RoPE's wavelength scale, θ_j = base^(−2j/E) (``position="rope"`` only; Llama: 1e4, SmolLM2: 1e5).
        backend: attention backend (``"auto"``, ``"sdpa"``, ``"math"``, ``"flash"``).
        qk_norm: RMS-normalize each head's queries and keys (learned gains) before the scores: True (PyTorch's
            RMSNorm with its default ε), or a norm kind of ``norm_layer``'s names, built with ``norm_eps`` (Gemma 3:
            ``"rmsnorm1p"``).
        head_dim: per-head width E (default ``dim // num_heads``; Gemma 3 270M: 256 with D = 640 and 4 heads).
        norm_placement: ``"pre"`` (GPT-2, Llama) or ``"sandwich"`` (Gemma: a norm before each sublayer and one on its
            output, ``x + N'(f(N(x)))``), or ``"none"``: no norm anywhere, ``x + f(x)`` and no final norm (an ablation;
            not exported).
        embedding_scale: the token embeddings' factor, ``x_0 = s · E[ids]`` (Gemma: √D; the head, tied, is not scaled).
        attention_windows: per layer, the keys a query sees: 0 for every earlier key (global), W for the W most recent
            (a sliding window, itself included); None: all global. Gemma 3: ``[512]*5 + [0]`` repeated.
        rope_local_base: RoPE base of the layers with a window (None: ``rope_base``; Gemma 3: 1e4, global 1e6).
        quantized: weights held in GGUF blocks, kept as a GGUF file stores them (an imported file's Q4_0, Q4_1,
            Q8_0, Q5_0, Q4_K, Q5_K and Q6_K tensors):
            module name (``*`` for any layer index, e.g. ``"decoder.blocks.*.mlp.fc1"``) →
            block format (see :mod:`tokennet.layers.blockquant`). ``"tok_emb"`` is the embedding table; tied to
            the LM head, the two share one set of blocks. Empty (the default): float weights everywhere.
        qkv_bias: biases on the query, key and value projections only, with ``bias=False`` elsewhere (Qwen2).
    """

    vocab_size: int = 256
    block_size: int = 256
    num_kv_heads: int | None = None
    position: str = "learned"
    tie_weights: bool = True
    bias: bool = True
    mixer: str = "attention"
    activation: str = "gelu"
    norm_eps: float = 1e-5
    norm_layer: str = "layernorm"
    gated_mlp: bool = False
    rope_base: float = 10000.0
    qk_norm: bool | str = False
    head_dim: int | None = None
    norm_placement: str = "pre"
    embedding_scale: float = 1.0
    attention_windows: list[int] | None = None
    rope_local_base: float | None = None
    quantized: dict[str, str] = field(default_factory=dict)
    qkv_bias: bool = False

    @property
    def head_width(self) -> int:
        """The per-head width E: ``head_dim``, or ``dim // num_heads``."""
        return self.head_dim or self.dim // self.num_heads

    def window(self, layer: int) -> int:
        """Layer ``layer``'s attention window (0: global)."""
        return self.attention_windows[layer] if self.attention_windows else 0

    def __post_init__(self):
        self.family = "gpt"
        self._positive(vocab_size=self.vocab_size, block_size=self.block_size, dim=self.dim,
                       num_layers=self.num_layers, num_heads=self.num_heads)
        self._choice("position", self.position, POSITIONS)
        self._choice("mixer", self.mixer, ("attention", "token"))
        self._choice("activation", self.activation, tuple(ACTIVATIONS))
        self._choice("norm_layer", self.norm_layer, NORM_LAYERS)
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or not self.rope_base > 0:
            raise ConfigError(f"rope_base must be a positive number (usually 10000.0), got {self.rope_base!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        self._mlp_and_backend()
        if not isinstance(self.qk_norm, bool) and self.qk_norm not in NORM_LAYERS:
            raise ConfigError(f"qk_norm must be true, false or a norm kind {NORM_LAYERS}, got {self.qk_norm!r}")
        self._choice("norm_placement", self.norm_placement, ("pre", "sandwich", "none"))
        if self.head_dim is not None and (isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int)
                                          or self.head_dim < 1):
            raise ConfigError(f"head_dim must be a positive integer or null, got {self.head_dim!r}")
        if isinstance(self.embedding_scale, bool) or not isinstance(self.embedding_scale, (int, float)) \
                or not math.isfinite(self.embedding_scale) or self.embedding_scale <= 0:
            raise ConfigError(f"embedding_scale must be a positive number, got {self.embedding_scale!r}")
        if self.attention_windows is not None:
            windows = self.attention_windows
            if not isinstance(windows, list) or len(windows) != self.num_layers or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in windows):
                raise ConfigError(f"attention_windows must list one window per layer ({self.num_layers}), each an "
                                  f"integer >= 0 (0: global), got {windows!r}")
            if any(windows) and self.mixer != "attention":
                raise ConfigError("attention_windows needs mixer='attention'")
        if self.rope_local_base is not None and (
                isinstance(self.rope_local_base, bool) or not isinstance(self.rope_local_base, (int, float))
                or not self.rope_local_base > 0):
            raise ConfigError(f"rope_local_base must be a positive number or null, got {self.rope_local_base!r}")
        if self.rope_local_base is not None and self.position != "rope":
            raise ConfigError("rope_local_base needs position='rope'")
        if self.qk_norm and self.mixer != "attention":
            raise ConfigError("qk_norm needs mixer='attention' (the token mixer has no queries or keys)")
        if self.mixer == "token" and self.position in ("rope", "alibi"):
            raise ConfigError(f"mixer='token' takes no position={self.position!r} (its mixing matrix is already "
                              "position-specific); use position='learned' or 'sinusoidal'")
        if self.dim % self.num_heads and self.head_dim is None:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim} (or set head_dim)")
        if self.num_kv_heads is not None and (self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            raise ConfigError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        self._fraction(dropout=self.dropout)
        if self.position == "rope" and self.head_width % 2:
            raise ConfigError("rope needs an even head width (dim/num_heads or head_dim)")
        if self.position == "sinusoidal" and self.dim % 2:
            raise ConfigError(f"position='sinusoidal' needs an even dim (sin/cos pairs), got dim={self.dim}")
        if not isinstance(self.qkv_bias, bool) or (self.qkv_bias and self.mixer != "attention"):
            raise ConfigError(f"qkv_bias must be true or false (true needs mixer='attention'), got {self.qkv_bias!r}")
        if not isinstance(self.quantized, dict) or not all(
                isinstance(k, str) and v in BLOCK_FORMATS for k, v in self.quantized.items()):
            raise ConfigError(f"quantized must map module names to block formats {list(BLOCK_FORMATS)}, "
                              f"got {self.quantized!r}")


class GPT(nn.Module):
    """Decoder-only transformer LM: ``forward(idx (B, T), targets=None) → Output(logits, loss)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = cfg = config
        # A model holding GGUF blocks (an imported file) does not build its float32 weights first (538 MB for
        # SmolLM2-135M, to be thrown away): its layers are made on the meta device and the blocks replace them.
        # (Modules are registered in the same order either way: optimizer states follow that order.)
        meta = (lambda: torch.device("meta")) if cfg.quantized else contextlib.nullcontext
        if cfg.quantized or torch.get_default_device().type == "meta":  # (normal_ on meta would load torch._dynamo)
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim,
                                        _weight=torch.empty(cfg.vocab_size, cfg.dim, device="meta"))
        else:
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_emb = None
        if cfg.position == "learned":
            self.pos_emb = LearnedPosition(cfg.block_size, cfg.dim)
        elif cfg.position == "sinusoidal":
            self.pos_emb = SinusoidalPosition(cfg.dim, max_len=cfg.block_size)
        self.rope = RotaryEmbedding(cfg.head_width, base=cfg.rope_base) if cfg.position == "rope" else None
        # Layers with a window turn with their own base (Gemma 3: 1e4 local, 1e6 global).
        self.rope_local = (RotaryEmbedding(cfg.head_width, base=cfg.rope_local_base)
                           if cfg.position == "rope" and cfg.rope_local_base is not None else None)
        self.alibi = ALiBi(cfg.num_heads) if cfg.position == "alibi" else None
        self.drop = (Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity())
        with meta():
            self.decoder = Decoder(
                cfg.dim, cfg.num_layers, cfg.num_heads, norm=cfg.norm_placement, dropout=cfg.dropout,
                num_kv_heads=cfg.num_kv_heads, bias=cfg.bias, mixer=cfg.mixer, num_tokens=cfg.block_size,
                backend=cfg.backend, head_dim=cfg.head_dim,
                qk_norm=(Norm(cfg.qk_norm, eps=cfg.norm_eps, bias=False) if isinstance(cfg.qk_norm, str)
                         else cfg.qk_norm),
                value_proj=cfg.value_proj,
                # LayerNorm (GPT-2) or RMSNorm (Llama)
                norm_layer=Norm(cfg.norm_layer, eps=cfg.norm_eps, bias=cfg.bias),
                mlp=mlp_kind(mlp_ratio=cfg.mlp_ratio, activation=cfg.activation, gated=cfg.gated_mlp,
                             dropout=cfg.dropout, bias=cfg.bias),  # GELU MLP (GPT-2) or SwiGLU (Llama)
            )
            self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
            if cfg.qkv_bias and not cfg.bias:
                self._qkv_biases()
        self._init(self)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        if cfg.quantized:
            self._use_blocks(cfg.quantized)
            for m in self.modules():  # what the blocks did not replace (norms, a float table) on the CPU
                if _materialize(m):
                    if hasattr(m, "reset_parameters"):
                        m.reset_parameters()
            self._init(self)
            if cfg.tie_weights and type(self.lm_head) is nn.Linear and type(self.tok_emb) is nn.Embedding:
                self.lm_head.weight = self.tok_emb.weight  # to_empty made each its own tensor
            if cfg.tie_weights and isinstance(self.lm_head, BlockLinear) and isinstance(self.tok_emb, BlockEmbedding):
                self.tok_emb.qs, self.tok_emb.d, self.tok_emb.m = self.lm_head.qs, self.lm_head.d, self.lm_head.m

    def _qkv_biases(self) -> None:
        """Qwen2's attention: ``[Q; K; V] = X [W_q; W_k; W_v]ᵀ + [b_q; b_k; b_v]``, the other layers without biases."""
        for blk in self.decoder.blocks:
            old = blk.attn.qkv_proj
            blk.attn.qkv_proj = nn.Linear(old.in_features, old.out_features, bias=True, device=old.weight.device)

    def _init(self, module: nn.Module) -> None:
        module.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/√(2L) so the residual stream's variance stays put.
        for name, param in module.named_parameters():
            if name.endswith(("out_proj.weight", "fc2.weight")) and not param.is_meta:
                nn.init.normal_(param, 0.0, 0.02 / math.sqrt(2 * self.config.num_layers))

    def _use_blocks(self, formats: dict[str, str]) -> None:
        """Replace the modules ``formats`` names by empty block-quantized ones (filled by ``load_state_dict``)."""
        def fmt_of(name: str) -> str | None:
            hits = {block_format for pattern, block_format in formats.items() if fnmatchcase(name, pattern)}
            if len(hits) > 1:
                raise ConfigError(f"quantized gives {name} two formats: {sorted(hits)}")
            return hits.pop() if hits else None

        used: set[str] = set()
        emb = fmt_of("tok_emb")
        if self.config.tie_weights and emb != fmt_of("lm_head") and None not in (emb, fmt_of("lm_head")):
            raise ConfigError(f"the tied embedding and LM head need one format, got {emb} and {fmt_of('lm_head')}")
        for name, mod in list(self.named_modules()):
            fmt = fmt_of(name)
            if fmt is None or name == "tok_emb":
                continue
            if type(mod) is not nn.Linear:
                raise ConfigError(f"quantized names {name}, which is not a linear layer")
            if mod.in_features % group_size(fmt):
                raise ConfigError(f"quantized: {name} has in_features={mod.in_features}, not a multiple of "
                                  f"{group_size(fmt)} ({fmt} blocks)")
            parent, _, child = name.rpartition(".")
            with torch.device("meta"):  # allocated (not written) by __init__'s to_empty: the load fills them
                block = BlockLinear(mod.in_features, mod.out_features, fmt, bias=mod.bias is not None)
            setattr(self.get_submodule(parent) if parent else self, child, block)
            used.update(glob for glob in formats if fnmatchcase(name, glob))
        if emb is not None or (self.config.tie_weights and isinstance(self.lm_head, BlockLinear)):
            if self.config.tie_weights:
                if not isinstance(self.lm_head, BlockLinear):
                    with torch.device("meta"):
                        self.lm_head = BlockLinear(self.config.dim, self.config.vocab_size, emb)
                table = self.lm_head
            else:
                with torch.device("meta"):
                    table = BlockLinear(self.config.dim, self.config.vocab_size, emb)
            self.tok_emb = BlockEmbedding(table)
            used.update(glob for glob in formats if fnmatchcase("tok_emb", glob) or fnmatchcase("lm_head", glob))
        unused = sorted(set(formats) - used)
        if unused:
            raise ConfigError(f"quantized names modules this model does not have: {unused}")

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # (a meta tensor has no values to draw; under torch.device("meta") normal_ would load torch._dynamo, ~75 MB)
        if isinstance(getattr(m, "weight", None), Tensor) and m.weight.is_meta:
            return
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameters, counting each weight held in blocks (see ``quantized``) as one; tied tensors once."""
        n = sum(param.numel() for param in self.parameters())
        n += sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, BlockLinear))
        if isinstance(self.tok_emb, BlockEmbedding) and not self.config.tie_weights:
            n += self.tok_emb.num_embeddings * self.tok_emb.embedding_dim
        if exclude_embeddings and isinstance(self.pos_emb, LearnedPosition):
            n -= self.pos_emb.weight.numel()
        return n

    def example_input(self, batch_size: int = 2) -> Tensor:
        """A valid input for tests and tracing: random token ids ``(B, block_size)``."""
        gen = torch.Generator().manual_seed(0)
        return torch.randint(self.config.vocab_size, (batch_size, self.config.block_size), generator=gen)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        """Targets matching :meth:`example_input`: random next-token ids ``(B, block_size)``."""
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.vocab_size, (batch_size, self.config.block_size), generator=gen)

    def make_caches(self, max_len: int | None = None) -> list[KVCache]:
        """Empty KV caches, one per layer, for decoding up to ``max_len`` (default block_size) tokens."""
        return self.decoder.make_caches(max_len or self.config.block_size)

    def forward_features(self, idx: Tensor, *, caches: list[KVCache] | None = None, return_attention: bool = False,
                         positions: Tensor | None = None, mask: Tensor | None = None):
        """Token ids ``(B, T)`` → final hidden states ``(B, T, D)``; with caches, ids follow the cached ones.

        With ``return_attention``, ``(h, maps)``: each block's weights (see :meth:`Decoder.forward`).

        Rows at different lengths (a batch of sequences decoded together, each with its own cache row)
        pass ``positions`` ``(B, T)``, each token's absolute position, and ``mask`` ``(B, 1, T, Nk)``, True
        where a row's key is real (the causal mask still applies, queries being the last T of Nk keys).
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        if positions is not None:
            return self._rows_forward(idx, positions, mask, caches)
        offset = caches[0].length if caches else 0
        if offset + T > self.config.block_size:
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds block_size={self.config.block_size}; "
                "crop the input or decode with a sliding window"
            )
        x = self.embed(idx)  # (B, T, D)
        if self.pos_emb is not None:
            x = self.pos_emb(x, offset)
        x = self.drop(x)
        rope = self.rope(T, offset, device=idx.device, dtype=x.dtype) if self.rope is not None else None
        if self.rope_local is not None:  # one table per base, each layer given its own
            local = self.rope_local(T, offset, device=idx.device, dtype=x.dtype)
            rope = [local if self.config.window(i) else rope for i in range(self.config.num_layers)]
        bias = self.alibi(T, offset + T).to(device=idx.device, dtype=x.dtype) if self.alibi is not None else None
        mask = None
        # A window shorter than the keys: that layer's causal band i − W < j ≤ i (others: the causal mask only).
        bands = {window: sliding_window(T, offset + T, window, device=idx.device)
                 for window in set(self.config.attention_windows or ()) if 0 < window < offset + T}
        if bands:
            mask = [bands.get(self.config.window(i)) for i in range(self.config.num_layers)]
        return self.decoder(x, mask=mask, is_causal=True, rope=rope, bias=bias, caches=caches,
                            return_weights=return_attention)

    def embed(self, idx: Tensor) -> Tensor:
        """Token ids ``(B, T)`` → ``s · E[ids]`` ``(B, T, D)`` (``s = embedding_scale``: 1, or √D for Gemma)."""
        x = self.tok_emb(idx)  # (B, T, D)
        scale = self.config.embedding_scale
        return x if scale == 1.0 else x * torch.tensor(scale, dtype=x.dtype)

    def _rows_forward(self, idx: Tensor, positions: Tensor, mask: Tensor | None, caches) -> Tensor:
        """:meth:`forward_features` with per-row positions: the same formulas, each row at its own offset."""
        if positions.shape != idx.shape:
            raise ValueError(f"positions must have the shape of idx {tuple(idx.shape)}, got {tuple(positions.shape)}")
        if not torch.compiler.is_compiling() and (int(positions.max()) >= self.config.block_size
                                                  or int(positions.min()) < 0):  # (a compiled step: checked eagerly)
            raise ValueError(f"positions must be in [0, block_size={self.config.block_size})")
        x = self.embed(idx)  # (B, T, D)
        if isinstance(self.pos_emb, LearnedPosition):
            x = x + self.pos_emb.weight[positions].to(x.dtype)
        elif isinstance(self.pos_emb, SinusoidalPosition):
            x = x + self.pos_emb.pe[positions].to(x.dtype)
        x = self.drop(x)
        rope = bias = None
        if self.rope is not None:  # RotaryEmbedding's angles, i·θ_j, at each row's positions
            freqs = positions.to(torch.float32)[..., None] * self.rope.inv_freq.to(idx.device)  # (B, T, E/2)
            rope = tuple(t[:, None].to(x.dtype) for t in self.rope.cos_sin(freqs))  # (B, 1, T, E): over heads
            if self.rope_local is not None:
                freqs = positions.to(torch.float32)[..., None] * self.rope_local.inv_freq.to(idx.device)  # (B, T, E/2)
                local = tuple(t[:, None].to(x.dtype) for t in self.rope_local.cos_sin(freqs))  # (B, 1, T, E)
                rope = [local if self.config.window(i) else rope for i in range(self.config.num_layers)]
        if self.alibi is not None:  # bias[b, h, i, j] = −m_h · (pos_bi − j)
            if mask is None:
                raise ValueError("per-row positions with ALiBi need the key mask (B, 1, T, Nk)")
            keys = torch.arange(mask.shape[-1], device=idx.device)
            dist = (positions[:, None, :, None] - keys).to(x.dtype)  # (B, 1, T, Nk)
            bias = -self.alibi.slopes.to(device=idx.device, dtype=x.dtype)[None, :, None, None] * dist  # (B, H, T, Nk)
        if self.config.attention_windows and any(self.config.attention_windows):
            n_k = mask.shape[-1] if mask is not None else (caches[0].length + idx.shape[1] if caches else idx.shape[1])
            bands = {window: window_band(positions, n_k, window)
                     for window in set(self.config.attention_windows) if window}
            mask = [mask if not self.config.window(i) else
                    bands[self.config.window(i)] if mask is None else mask & bands[self.config.window(i)]
                    for i in range(self.config.num_layers)]
        return self.decoder(x, mask=mask, is_causal=True, rope=rope, bias=bias, caches=caches)

    def attention_maps(self, idx: Tensor) -> AttentionMaps:
        """Every layer's causal self-attention ``A = softmax(Q Kᵀ / √E + causal mask)`` over ``idx`` ``(B, T)``:
        ``{"self": [(B, H, T, T)] * L}``, computed with the plain formula whatever the backend."""
        _, maps = self.forward_features(idx, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    def forward_head(self, h: Tensor) -> Tensor:
        """Hidden states ``(B, T, D)`` → next-token logits ``(B, T, V)``."""
        return self.lm_head(h)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, caches: list[KVCache] | None = None) -> Output:
        """Logits for every position, and the mean cross-entropy when ``targets`` (B, T) are given.

        Targets equal to -100 are ignored (padding).
        """
        logits = self.forward_head(self.forward_features(idx, caches=caches))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return Output(logits, loss)


register_family("gpt", GPTConfig, GPT)
register_preset("gpt", "gpt", "GPT, 6 layers × 384 wide (GPT-2 shaped; set vocab_size/block_size)")
register_preset("gpt-mini", "gpt", "GPT, 4 layers × 128 wide, 4 heads, context 64 (nanoGPT's CPU config)",
                dim=128, num_layers=4, num_heads=4, block_size=64)
register_preset("gpt-micro", "gpt", "GPT, 2 layers × 64 wide (tests and demos)",
                dim=64, num_layers=2, num_heads=4, block_size=64)


def _materialize(module: nn.Module) -> bool:
    """Give ``module``'s own tensors on the meta device storage on the CPU (uninitialized), as ``to_empty`` does
    (which goes through PyTorch's Python reference of ``empty_like`` and its ~0.3 s of imports); whether any was."""
    found = False
    for name, param in list(module.named_parameters(recurse=False)):
        if param.is_meta:
            setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=param.dtype),
                                               requires_grad=param.requires_grad))
            found = True
    for name, buffer in list(module.named_buffers(recurse=False)):
        if buffer.is_meta:
            module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype)
            found = True
    return found
