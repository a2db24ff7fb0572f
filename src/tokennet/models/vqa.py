"""Answering questions about a picture: one transformer over question and patch tokens, and a CNN baseline.

**The transformer** (family ``vqa-transformer``) is the lecture's picture of attention — *"when you get a
new question, you'll just attend to the parts of the input signal that matter"*. The question is tokens,
the image is tokens, and one generic encoder processes the sequence (single-stream, as in ViLT, Kim et al.
2021, https://arxiv.org/abs/2102.03334)::

    z₀ = [q; w₁ … w_T; x_p¹E … x_pᴺE] + type + position      q: a learned summary token
    z_ℓ = z_ℓ + MSA(LN(z_ℓ)),  z_ℓ = z_ℓ + MLP(LN(z_ℓ))      L pre-norm blocks
    answer = argmax Linear(LN(z_L^q))                         read from the question's summary token

Row ``q`` of each layer's ``A = softmax(Q Kᵀ / √E)`` is where the question looks: its query is matched
against the keys of the patch tokens. Padding words are masked as keys. ``modality_mask="image-first"``
lets the patches attend only to patches (the image is encoded without the question, and only the question
tokens read it); ``"full"`` lets every token attend to every token.

**The CNN baseline** (family ``vqa-cnn``) answers the same questions the way a CNN can: a GRU reads the
question, and FiLM (Perez et al. 2018, https://arxiv.org/abs/1709.07871) conditions every block of a conv
trunk on it — ``h ← (1 + γ(q)) ⊙ h + β(q)`` — followed by global average pooling and one linear layer
(:mod:`tokennet.models.cnn`). The question changes *what every filter computes*, but every unit still sees
only its receptive field, and the answer is the mean of the units' votes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.masks import padding
from ..errors import ConfigError
from ..layers.stack import AttentionMaps, Encoder
from ..tokens.image import PatchEmbed, grid_size
from .cnn import ConvTrunk, ConvTrunkConfig, ReceptiveField, init_conv_weights
from .registry import ModelConfig, Output, register_family, register_preset

__all__ = ["VQATransformerConfig", "VQATransformer", "VQACNNConfig", "VQACNN", "MODALITY_MASKS"]

MODALITY_MASKS = ("full", "image-first")
PATCH_EMBEDS = ("linear", "patchify-stem", "patch-cnn")


class PatchifyStem(nn.Module):
    """Patches → tokens by a small CNN whose every kernel equals its stride: ``2×2/2 → ReLU → 2×2/2 → ReLU →
    (p/4)×(p/4)/(p/4)``. Each token is still computed from its own ``p × p`` patch and nothing else (the
    receptive field is the patch), but nonlinearly, with filters shared across the patch's sub-cells."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, width: int = 16):
        super().__init__()
        if patch_size % 4 or patch_size < 4:
            raise ConfigError(f"patch_embed='patchify-stem' needs patch_size a multiple of 4, got {patch_size}")
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, width, 2, 2), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 2, 2), nn.ReLU(),
            nn.Conv2d(2 * width, dim, patch_size // 4, patch_size // 4))

    def forward(self, images: Tensor) -> Tensor:
        return self.layers(images).flatten(2).transpose(1, 2)  # (B, D, gh, gw) → (B, N, D)


class PatchCNN(nn.Module):
    """Patches → tokens by one small CNN applied to every patch on its own (the patches are cut first, so no
    filter crosses a patch border: a token's receptive field is its patch). ``3×3 conv → ReLU → 2×2 max-pool``
    twice, a third ``3×3 conv → ReLU``, then the ``(p/4)²`` positions flattened and projected to ``D``: filters
    shared across the patch, as a CNN's are, so a shape is recognized wherever it sits in its patch."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, width: int = 8):
        super().__init__()
        if patch_size % 4 or patch_size < 4:
            raise ConfigError(f"patch_embed='patch-cnn' needs patch_size a multiple of 4, got {patch_size}")
        self.patch_size = patch_size
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.ReLU())
        self.proj = nn.Linear(4 * width * (patch_size // 4) ** 2, dim)

    def forward(self, images: Tensor) -> Tensor:
        B, C, H, W = images.shape
        p = self.patch_size
        gh, gw = H // p, W // p
        x = images.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, p, p)
        x = x.reshape(B * gh * gw, C, p, p)  # every patch an image of its own
        h = self.convs(x).flatten(1)  # (B·N, 4w·(p/4)²)
        return self.proj(h).view(B, gh * gw, -1)  # (B, N, D)


def _standardize(config, images: Tensor) -> Tensor:
    """``(x − μ) / σ`` per channel, with the data's pixel statistics (``pixel_mean``, ``pixel_std``): the
    background becomes ≈ 0 and an animal a large signal, where raw pixels would give every patch token the
    same large background component and leave attention nothing to tell apart at the start."""
    mean = images.new_tensor(config.pixel_mean)[:, None, None]
    std = images.new_tensor(config.pixel_std)[:, None, None]
    return (images - mean) / std


def _check_pixels(config) -> None:
    for k in ("pixel_mean", "pixel_std"):
        v = getattr(config, k)
        if isinstance(v, tuple):
            setattr(config, k, list(v))
        v = getattr(config, k)
        if not isinstance(v, list) or len(v) != config.in_channels or not all(isinstance(x, (int, float)) for x in v):
            raise ConfigError(f"{k} must be a list of {config.in_channels} numbers (one per channel), got {v!r}")
    if not all(x > 0 for x in config.pixel_std):
        raise ConfigError(f"pixel_std must be positive, got {config.pixel_std}")


# The generated scenes' pixel statistics per channel (measured on 320 training pictures; a user's data
# replaces them with its own).
PIXEL_MEAN = [0.92, 0.89, 0.83]
POSITION_STD = 0.5
PIXEL_STD = [0.13, 0.15, 0.14]


def _example(config, batch_size: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch_size, config.in_channels, config.image_size, config.image_size, generator=g)
    questions = torch.randint(1, config.vocab_size, (batch_size, config.max_question_len), generator=g)
    questions[:, config.max_question_len // 2:] = 0  # padding after the words
    return images, questions


def _check_inputs(config, inputs) -> tuple[Tensor, Tensor]:
    if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2):
        raise ValueError("a question-answering model takes (images (B, 3, H, W), questions (B, T)) as one pair")
    images, questions = inputs
    c = config
    if images.dim() != 4 or tuple(images.shape[1:]) != (c.in_channels, c.image_size, c.image_size):
        raise ValueError(f"images must be (B, {c.in_channels}, {c.image_size}, {c.image_size}), got "
                         f"{tuple(images.shape)}")
    if questions.dim() != 2 or questions.shape[0] != images.shape[0] or questions.shape[1] > c.max_question_len:
        raise ValueError(f"questions must be word ids (B, T ≤ {c.max_question_len}) for the B images, got "
                         f"{tuple(questions.shape)}")
    return images, questions


@dataclass
class VQATransformerConfig(ModelConfig):
    """Config of :class:`VQATransformer`.

    Args:
        image_size: square images of ``image_size`` pixels; ``patch_size`` must divide it.
        patch_size: side of the square patches (one token each).
        in_channels: image channels.
        vocab_size: question words (id 0 is padding).
        num_answers: answer classes.
        max_question_len: most words in a question.
        dim, num_layers, num_heads, mlp_ratio, dropout: the encoder.
        modality_mask: ``"full"`` or ``"image-first"`` (patches attend only to patches).
        patch_embed: ``"linear"`` (ViT's ``x_p E``), ``"patchify-stem"`` (:class:`PatchifyStem`) or
            ``"patch-cnn"`` (:class:`PatchCNN`): how a patch becomes a token (each sees only its own patch).
        pixel_mean, pixel_std: per-channel statistics the images are standardized with (from the data).
        label_smoothing: the loss's label smoothing.
        backend: attention backend.
    """

    image_size: int = 64
    patch_size: int = 16
    in_channels: int = 3
    vocab_size: int = 32
    num_answers: int = 17
    max_question_len: int = 12
    dim: int = 96
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: float = 2.0
    dropout: float = 0.0
    modality_mask: str = "full"
    patch_embed: str = "linear"
    pixel_mean: list[float] = field(default_factory=lambda: list(PIXEL_MEAN))
    pixel_std: list[float] = field(default_factory=lambda: list(PIXEL_STD))
    label_smoothing: float = 0.0
    backend: str = "auto"

    def __post_init__(self):
        self.family = "vqa-transformer"
        _check_pixels(self)
        self._choice("patch_embed", self.patch_embed, PATCH_EMBEDS)
        self._positive(image_size=self.image_size, patch_size=self.patch_size, in_channels=self.in_channels,
                       vocab_size=self.vocab_size, num_answers=self.num_answers,
                       max_question_len=self.max_question_len, dim=self.dim, num_layers=self.num_layers,
                       num_heads=self.num_heads)
        self._choice("modality_mask", self.modality_mask, MODALITY_MASKS)
        self._mlp_and_backend()
        self._fraction(dropout=self.dropout, label_smoothing=self.label_smoothing)
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")

    @property
    def grid(self) -> tuple[int, int]:
        return grid_size(self.image_size, self.patch_size)

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def num_text(self) -> int:
        """Question positions: the summary token and ``max_question_len`` words."""
        return 1 + self.max_question_len


class VQATransformer(nn.Module):
    """``forward((images (B, 3, H, W), questions (B, T)), answers=None) → Output(logits (B, A), loss)``.

    Token order: the summary token ``q`` (index 0), the ``max_question_len`` word slots, then the patches
    row-major (index ``num_text + n`` is patch ``n``).
    """

    def __init__(self, config: VQATransformerConfig):
        super().__init__()
        self.config = c = config
        embed = {"linear": PatchEmbed, "patchify-stem": PatchifyStem, "patch-cnn": PatchCNN}[c.patch_embed]
        self.patch_embed = embed(c.in_channels, c.dim, c.patch_size)
        self.word_emb = nn.Embedding(c.vocab_size, c.dim, padding_idx=0)
        self.summary = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.type_emb = nn.Parameter(torch.zeros(2, c.dim))  # 0: question, 1: image
        self.text_pos = nn.Parameter(torch.zeros(c.num_text, c.dim))
        self.patch_pos = nn.Parameter(torch.zeros(c.num_patches, c.dim))
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(c.dim, c.num_layers, c.num_heads, mlp_ratio=c.mlp_ratio, norm="pre",
                               dropout=c.dropout, activation="gelu", backend=c.backend)
        self.head = nn.Linear(c.dim, c.num_answers)
        for p in (self.summary, self.type_emb):
            nn.init.normal_(p, 0.0, 0.02)
        # Positions start as large as the content (words: N(0, 1), standardized patches: about as much), not at
        # ViT's 0.02: a question about the top right corner must be able to find it from the first steps.
        for p in (self.text_pos, self.patch_pos):
            nn.init.normal_(p, 0.0, POSITION_STD)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        return _example(self.config, batch_size)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        return torch.randint(self.config.num_answers, (batch_size,), generator=torch.Generator().manual_seed(1))

    def _tokens(self, inputs) -> tuple[Tensor, Tensor]:
        """``(tokens (B, L, D), mask (B, 1, L, L) or (B, 1, 1, L))`` with ``L = num_text + num_patches``."""
        c = self.config
        images, questions = _check_inputs(c, inputs)
        B, T = questions.shape
        if T < c.max_question_len:  # pad to the fixed slots (positions are per slot)
            questions = F.pad(questions, (0, c.max_question_len - T))
        words = self.word_emb(questions)  # (B, T, D)
        # The summary token starts as the question's bag of words, so the first layer can already look for what
        # the question asks (a learned constant alone would make its first query the same for every question).
        n_words = (questions != 0).sum(1, keepdim=True).clamp_min(1)  # (B, 1)
        bag = (words.sum(1) / n_words)[:, None]  # (B, 1, D)
        text = torch.cat([self.summary + bag, words], 1) + self.text_pos + self.type_emb[0]  # (B, 1 + T, D)
        patches = self.patch_embed(_standardize(c, images)) + self.patch_pos + self.type_emb[1]  # (B, N, D)
        z = torch.cat([text, patches], 1)  # (B, L, D)
        is_pad = torch.cat([torch.zeros(B, 1, dtype=torch.bool, device=z.device), questions == 0,
                            torch.zeros(B, c.num_patches, dtype=torch.bool, device=z.device)], 1)  # (B, L)
        mask = padding(is_pad)  # (B, 1, 1, L): nobody attends to padding words
        if c.modality_mask == "image-first":
            L = z.shape[1]
            allowed = torch.ones(L, L, dtype=torch.bool, device=z.device)
            allowed[c.num_text:, :c.num_text] = False  # a patch's query never meets a question key
            mask = mask & allowed  # (B, 1, L, L)
        return self.drop(z), mask

    def forward_features(self, inputs, *, return_attention: bool = False):
        """Final tokens ``(B, L, D)`` (with ``return_attention``: ``(tokens, per-layer weights)``)."""
        z, mask = self._tokens(inputs)
        return self.encoder(z, mask=mask, return_weights=return_attention)

    def forward_head(self, h: Tensor) -> Tensor:
        """Final tokens → answer logits ``(B, A)``, read from the summary token."""
        return self.head(h[:, 0])

    def forward(self, inputs, targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(inputs))  # (B, A)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.config.label_smoothing)
        return Output(logits, loss)

    def attention_maps(self, inputs) -> AttentionMaps:
        """Every layer's ``A = softmax(Q Kᵀ / √E)``: ``{"self": [(B, H, L, L)] * num_layers}`` (plain formula)."""
        _, maps = self.forward_features(inputs, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    def question_attention(self, inputs) -> list[Tensor]:
        """Per layer, the summary token's attention over the patches ``(B, H, N)`` (its row of ``A``,
        the patch columns; the rest of the row went to the question's own tokens)."""
        n = self.config.num_text
        return [a[:, :, 0, n:] for a in self.attention_maps(inputs)["self"]]


# -- the CNN baseline -------------------------------------------------------------------------------------------
@dataclass
class VQACNNConfig(ConvTrunkConfig):
    """Config of :class:`VQACNN`: the conv trunk's fields (:class:`~tokennet.models.cnn.ConvTrunkConfig`),
    then the question's.

    Args:
        image_size: square images of this size.
        vocab_size, num_answers, max_question_len: as for the transformer.
        word_dim: word embedding width.
        question_dim: the GRU's hidden width (the question vector FiLM reads).
        pixel_mean, pixel_std: per-channel statistics the images are standardized with (from the data).
        label_smoothing: the loss's label smoothing.
    """

    image_size: int = 64
    vocab_size: int = 32
    num_answers: int = 17
    max_question_len: int = 12
    word_dim: int = 32
    question_dim: int = 64
    pixel_mean: list[float] = field(default_factory=lambda: list(PIXEL_MEAN))
    pixel_std: list[float] = field(default_factory=lambda: list(PIXEL_STD))
    label_smoothing: float = 0.0

    def __post_init__(self):
        self.family = "vqa-cnn"
        self._check_trunk()
        _check_pixels(self)
        self._positive(image_size=self.image_size, vocab_size=self.vocab_size, num_answers=self.num_answers,
                       max_question_len=self.max_question_len, word_dim=self.word_dim,
                       question_dim=self.question_dim)
        self._fraction(label_smoothing=self.label_smoothing)


class VQACNN(nn.Module):
    """``forward((images, questions), answers=None) → Output(logits, loss)``: GRU → FiLM → conv trunk → GAP →
    linear."""

    def __init__(self, config: VQACNNConfig):
        super().__init__()
        self.config = c = config
        self.word_emb = nn.Embedding(c.vocab_size, c.word_dim, padding_idx=0)
        self.gru = nn.GRU(c.word_dim, c.question_dim, batch_first=True)
        self.trunk = ConvTrunk(c)
        self.channels = self.trunk.film_channels()
        self.film = nn.Linear(c.question_dim, 2 * sum(self.channels))
        self.head = nn.Linear(self.trunk.out_channels, c.num_answers)
        self.apply(init_conv_weights)
        nn.init.zeros_(self.film.weight)  # start as the unconditioned trunk: γ = β = 0
        nn.init.zeros_(self.film.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def receptive_field(self) -> ReceptiveField:
        return self.trunk.receptive_field()

    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        return _example(self.config, batch_size)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        return torch.randint(self.config.num_answers, (batch_size,), generator=torch.Generator().manual_seed(1))

    def encode_question(self, questions: Tensor) -> Tensor:
        """Word ids ``(B, T)`` → the GRU's state after the last word ``(B, question_dim)``."""
        lengths = (questions != 0).sum(1).clamp_min(1)  # (B,)
        out, _ = self.gru(self.word_emb(questions))  # (B, T, Dq)
        return out[torch.arange(len(questions), device=questions.device), lengths - 1]  # (B, Dq)

    def films(self, questions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per block, FiLM's ``(γ, β)`` ``(B, C_block)`` each."""
        gb = self.film(self.encode_question(questions))  # (B, 2 ΣC)
        out, i = [], 0
        for ch in self.channels:
            out.append((gb[:, i:i + ch], gb[:, i + ch:i + 2 * ch]))
            i += 2 * ch
        return out

    def forward_features(self, inputs) -> Tensor:
        """The conditioned feature map ``(B, C', H', W')``."""
        images, questions = _check_inputs(self.config, inputs)
        return self.trunk(_standardize(self.config, images), self.films(questions))

    def forward_head(self, h: Tensor) -> Tensor:
        return self.head(h.mean((2, 3)))  # (B, A): the mean of the units' linear votes

    def forward(self, inputs, targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(inputs))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.config.label_smoothing)
        return Output(logits, loss)

    def answer_map(self, inputs, answer: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Each unit's vote for the answer (a class activation map): ``(maps (B, H', W'), answers (B,))``."""
        h = self.forward_features(inputs)
        if answer is None:
            answer = self.forward_head(h).argmax(-1)
        return torch.einsum("bc,bchw->bhw", self.head.weight[answer], h), answer


register_family("vqa-transformer", VQATransformerConfig, VQATransformer)
register_family("vqa-cnn", VQACNNConfig, VQACNN)
register_preset("vqa-transformer", "vqa-transformer", "answers questions about 64×64 pictures: [question; 16×16 "
                "patches] in one encoder, 4 layers × 96, the answer read from the question's summary token")
register_preset("vqa-cnn", "vqa-cnn", "the CNN baseline for vqa: GRU question → FiLM on a small ResNet (4×4 "
                "patchify stem, stages 32/64/128; the receptive field covers the 64×64 image), GAP + linear",
                stem_kernel=4, stem_stride=4, widths=[32, 64, 128], depths=[1, 1, 1])
register_preset("vqa-cnn-shallow", "vqa-cnn", "a shallow CNN for vqa: FiLM on two conv layers after a 4×4 "
                "patchify stem (a 20-pixel receptive field: no unit sees two corners of the 64×64 image)",
                arch="plain", stem_kernel=4, stem_stride=4, widths=[64, 128], depths=[1, 1])
