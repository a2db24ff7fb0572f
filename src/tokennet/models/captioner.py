"""Image captioning in the lecture's two forms: encoder–decoder and decoder-only with a prefix mask.

Both read an image as tokens — ViT patches (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929):
``(B, C, H, W) → (B, P, D)`` by :class:`~tokennet.tokens.image.PatchEmbed`, plus learned 2-D positions
— and write the caption with a causal text decoder. They differ in how text reaches the image:

- :class:`Captioner` (family ``captioner``), encoder–decoder: a ViT encoder over the patches, then a
  decoder whose blocks have masked self-attention over the text and **cross-attention** from each text
  token to the image tokens, ``A = softmax(Q_text K_imageᵀ / √E)`` (as in "Show, Attend and Tell",
  Xu et al. 2015, with a transformer).
- :class:`PrefixCaptioner` (family ``captioner-prefix``), decoder-only: one stack over the sequence
  ``[image tokens; text tokens]`` under the cross-modality **prefix mask** (image tokens attend to each
  other; each text token attends to all image tokens and to earlier text), as in PaLI / the lecture's
  last slide. Same config fields; its stack has ``num_layers + num_decoder_layers`` blocks, so both
  forms have the same depth.

Inputs: ``(images (B, C, H, W) floats in [0, 1], tgt_in (B, T))``, targets ``(B, T)`` (-100 ignored).
An image of the wrong size or channel count raises ``ValueError``. Both follow the conditional
decoding protocol of :mod:`tokennet.decode` (greedy and beam search, cached and uncached).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention.masks import prefix
from ..attention.multihead import KVCache
from ..dropout import Dropout
from ..errors import ConfigError
from ..layers.stack import AttentionMaps, Decoder, Encoder
from ..position.learned import LearnedPosition, LearnedPosition2D
from ..tokens.image import PatchEmbed
from .registry import Output, TransformerConfig, register_family, register_preset
from .seqio import EncoderDecoderState, check_token_ids, condition_target, seq_loss

__all__ = ["CaptionerConfig", "PrefixCaptionerConfig", "Captioner", "PrefixCaptioner", "PrefixState"]


@dataclass
class CaptionerConfig(TransformerConfig):
    """Config of :class:`Captioner` (and, as :class:`PrefixCaptionerConfig`, of :class:`PrefixCaptioner`).

    Args:
        vocab_size: caption token ids.
        image_size: height and width H = W of the images.
        patch_size: patch side p; must divide ``image_size`` (P = (H/p)² image tokens).
        in_channels: image channels C.
        max_target_len: longest caption in tokens, ``<bos>`` included.
        dim, num_heads: width D and heads H.
        num_layers: image-encoder blocks (decoder-only: blocks, together with num_decoder_layers).
        num_decoder_layers: text-decoder blocks (None = num_layers).
        mlp_ratio: MLP width as a multiple of D.
        dropout: dropout everywhere.
        tie_weights: share the token embedding with the output layer.
        bias: biases in linear layers and norms.
        backend: attention backend.
        pad_id, bos_id, eos_id: special token ids.
    """

    vocab_size: int = 320
    image_size: int = 48
    patch_size: int = 8
    in_channels: int = 3
    max_target_len: int = 24
    num_decoder_layers: int | None = None
    tie_weights: bool = True
    bias: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        self.family = "captioner"
        self._validate()

    def _validate(self) -> None:
        self._positive(vocab_size=self.vocab_size, image_size=self.image_size, patch_size=self.patch_size,
                       in_channels=self.in_channels, max_target_len=self.max_target_len, dim=self.dim,
                       num_layers=self.num_layers, num_heads=self.num_heads)
        if self.num_decoder_layers is not None:
            self._positive(num_decoder_layers=self.num_decoder_layers)
        self._mlp_and_backend()
        if self.image_size % self.patch_size:
            raise ConfigError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        self._fraction(dropout=self.dropout)
        for k in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, k) < self.vocab_size:
                raise ConfigError(f"{k}={getattr(self, k)} must be a token id in [0, vocab_size={self.vocab_size})")

    @property
    def grid(self) -> tuple[int, int]:
        side = self.image_size // self.patch_size
        return side, side

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


@dataclass
class PrefixCaptionerConfig(CaptionerConfig):
    """Config of :class:`PrefixCaptioner`: the fields of :class:`CaptionerConfig`."""

    def __post_init__(self):
        self.family = "captioner-prefix"
        self._validate()


class _CaptionerBase(nn.Module):
    """Image tokens, text tokens, the head; what both forms share."""

    def __init__(self, config: CaptionerConfig):
        super().__init__()
        self.config = cfg = config
        self.patch = PatchEmbed(cfg.in_channels, cfg.dim, cfg.patch_size)
        self.img_pos = LearnedPosition2D(cfg.grid, cfg.dim)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.txt_pos = LearnedPosition(cfg.max_target_len, cfg.dim)
        self.drop = Dropout(cfg.dropout)
        self.block_kw = dict(mlp_ratio=cfg.mlp_ratio, norm="pre", dropout=cfg.dropout, bias=cfg.bias,
                             backend=cfg.backend, value_proj=cfg.value_proj)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def _init(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def check_images(self, images: Tensor) -> Tensor:
        """Raise ``ValueError`` unless ``images`` is ``(B, C, H, W)`` float of the model's size."""
        cfg = self.config
        want = (cfg.in_channels, cfg.image_size, cfg.image_size)
        if not torch.is_tensor(images) or images.dim() != 4 or tuple(images.shape[1:]) != want:
            got = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
            raise ValueError(f"expected images of shape (B, {want[0]}, {want[1]}, {want[2]}), got {got}; "
                             f"resize them to {cfg.image_size}×{cfg.image_size}")
        if not images.dtype.is_floating_point:
            raise ValueError(f"images must be floating point in [0, 1], got dtype {images.dtype}")
        return images

    def embed_image(self, images: Tensor) -> Tensor:
        """Images ``(B, C, H, W)`` → patch tokens with positions ``(B, P, D)``."""
        x = self.check_images(images) - 0.5  # pixels in [0, 1], centred so a white background is not a bias
        return self.drop(self.img_pos(self.patch(x)))

    def embed_text(self, ids: Tensor, offset: int = 0) -> Tensor:
        """Caption ids ``(B, T)`` → token embeddings with positions ``(B, T, D)``."""
        cfg = self.config
        check_token_ids(ids, cfg.vocab_size, cfg.max_target_len - offset, "caption")
        return self.drop(self.txt_pos(self.tok_emb(ids), offset))

    def forward_head(self, h: Tensor) -> Tensor:
        """Text states ``(B, T, D)`` → next-token logits ``(B, T, V)``."""
        return self.lm_head(h)

    def forward(self, inputs: tuple[Tensor, Tensor], targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(inputs))
        return Output(logits, seq_loss(logits, targets))

    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        """``(images, tgt_in)``: random images of the model's size and random caption ids."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        images = torch.rand(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size, generator=gen)
        tgt = torch.randint(cfg.vocab_size, (batch_size, min(8, cfg.max_target_len)), generator=gen)
        tgt[:, 0] = cfg.bos_id
        return images, tgt

    def example_targets(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.vocab_size, (batch_size, min(8, self.config.max_target_len)), generator=gen)


def _unpack(inputs) -> tuple[Tensor, Tensor]:
    return condition_target(inputs, pair="(images (B, C, H, W), tgt_in (B, T))", names=("image", "caption"))


class Captioner(_CaptionerBase):
    """Encoder–decoder captioner: ViT encoder, text decoder with cross-attention to the image tokens."""

    def __init__(self, config: CaptionerConfig):
        super().__init__(config)
        cfg = config
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, **self.block_kw)
        self.decoder = Decoder(cfg.dim, cfg.num_decoder_layers or cfg.num_layers, cfg.num_heads, cross_attention=True,
                               **self.block_kw)
        self._init()

    def encode(self, images: Tensor) -> Tensor:
        """Images → image tokens after the ViT encoder ``(B, P, D)``."""
        return self.encoder(self.embed_image(images))

    def forward_features(self, inputs) -> Tensor:
        images, tgt = _unpack(inputs)
        memory = self.encode(images)
        return self.decoder(self.embed_text(tgt), memory, is_causal=True)

    def init_decode(self, images: Tensor, *, use_cache: bool = True) -> EncoderDecoderState:
        memory = self.encode(images)
        caches = self.decoder.make_caches(self.config.max_target_len) if use_cache else None
        cross = self.decoder.make_cross_caches() if use_cache else None
        return EncoderDecoderState(memory, None, caches, cross)

    def decode_step(self, tokens: Tensor, state: EncoderDecoderState) -> Tensor:
        offset = state.caches[0].length if state.caches else 0
        feats = self.decoder(self.embed_text(tokens, offset), state.memory, is_causal=True, caches=state.caches,
                         cross_caches=state.cross_caches)
        return self.forward_head(feats)

    def attention_maps(self, inputs) -> AttentionMaps:
        """Every layer's attention under teacher forcing, plain formula: ``{"encoder": [(B, H, P, P)],
        "decoder": [(B, H, T, T)], "cross": [(B, H, T, P)]}`` — the cross rows are each word's attention
        over the image patches (Show, Attend and Tell, Fig. 2)."""
        images, tgt = _unpack(inputs)
        memory, enc = self.encoder(self.embed_image(images), return_weights=True)
        _, dec = self.decoder(self.embed_text(tgt), memory, is_causal=True, return_weights=True)
        return {"encoder": [m["self"] for m in enc], "decoder": [m["self"] for m in dec],
                "cross": [m["cross"] for m in dec]}


@dataclass
class PrefixState:
    """Decoding state of :class:`PrefixCaptioner`: image tokens and the caches of the one stack."""

    image_tokens: Tensor  # (B, P, D), embedded; the prefix, recomputed when uncached
    caches: list[KVCache] | None

    @property
    def batch_size(self) -> int:
        return self.image_tokens.shape[0]

    def reorder(self, index: Tensor) -> None:
        self.image_tokens = self.image_tokens.index_select(0, index)
        for cache in self.caches or []:
            cache.reorder(index)


class PrefixCaptioner(_CaptionerBase):
    """Decoder-only captioner: one stack over ``[image; text]`` under the prefix mask."""

    def __init__(self, config: CaptionerConfig):
        super().__init__(config)
        cfg = config
        self.decoder = Decoder(cfg.dim, cfg.num_layers + (cfg.num_decoder_layers or cfg.num_layers), cfg.num_heads,
                               **self.block_kw)
        self._init()

    def _run(self, x: Tensor, n_prefix: int, caches=None, return_attention: bool = False):
        offset = caches[0].length if caches else 0
        N = x.shape[1]
        mask = prefix(n_prefix, N, offset + N, device=x.device)  # (N, offset + N)
        return self.decoder(x, mask=mask, is_causal=False, caches=caches, return_weights=return_attention)

    def forward_features(self, inputs) -> Tensor:
        images, tgt = _unpack(inputs)
        img = self.embed_image(images)  # (B, P, D)
        P = img.shape[1]
        feats = self._run(torch.cat([img, self.embed_text(tgt)], dim=1), P)  # (B, P + T, D)
        return feats[:, P:]  # the text positions predict the next words

    def init_decode(self, images: Tensor, *, use_cache: bool = True) -> PrefixState:
        img = self.embed_image(images)
        if not use_cache:
            return PrefixState(img, None)
        caches = self.decoder.make_caches(img.shape[1] + self.config.max_target_len)
        self._run(img, img.shape[1], caches)  # prefill: the image tokens' keys and values, computed once
        return PrefixState(img, caches)

    def decode_step(self, tokens: Tensor, state: PrefixState) -> Tensor:
        P = state.image_tokens.shape[1]
        if state.caches is None:
            feats = self._run(torch.cat([state.image_tokens, self.embed_text(tokens)], dim=1), P)[:, P:]
        else:
            feats = self._run(self.embed_text(tokens, state.caches[0].length - P), P, state.caches)
        return self.forward_head(feats)

    def attention_maps(self, inputs) -> AttentionMaps:
        """Every layer's attention over ``[image; text]`` under the prefix mask, plain formula:
        ``{"self": [(B, H, P + T, P + T)]}``; rows ``P:`` × columns ``:P`` are each word's attention over
        the image patches."""
        images, tgt = _unpack(inputs)
        img = self.embed_image(images)  # (B, P, D)
        _, maps = self._run(torch.cat([img, self.embed_text(tgt)], dim=1), img.shape[1], return_attention=True)
        return {"self": [m["self"] for m in maps]}


register_family("captioner", CaptionerConfig, Captioner)
register_family("captioner-prefix", PrefixCaptionerConfig, PrefixCaptioner)
register_preset("captioner-small", "captioner", "Captioner, encoder–decoder: ViT 2 blocks + text decoder 2 blocks "
                "× 128, 48×48 images, 8×8 patches (shapes captions)")
register_preset("captioner-prefix-small", "captioner-prefix", "Captioner, decoder-only over [image; text] with "
                "the prefix mask, 4 blocks × 128, 48×48 images, 8×8 patches")
register_preset("captioner-micro", "captioner", "Captioner, encoder–decoder, 1+1 blocks × 32, 16×16 images (tests)",
                dim=32, num_layers=1, num_heads=2, image_size=16, patch_size=4, vocab_size=40, max_target_len=12)
register_preset("captioner-prefix-micro", "captioner-prefix", "Captioner, decoder-only, 2 blocks × 32, 16×16 "
                "images (tests)", dim=32, num_layers=1, num_heads=2, image_size=16, patch_size=4, vocab_size=40,
                max_target_len=12)
