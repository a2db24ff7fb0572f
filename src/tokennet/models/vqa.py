"""Answering questions about a picture: one transformer over question and patch tokens, and a CNN baseline.

**The transformer** (family ``vqa-transformer``) is the lecture's picture of attention — *"when you get a
new question, you'll just attend to the parts of the input signal that matter"*. The question is tokens,
the image is tokens, and one generic encoder processes the sequence (single-stream, as in ViLT, Kim et al.
2021, https://arxiv.org/abs/2102.03334)::

    z₀ = [q; s; w₁ … w_T; x̂_p¹E … x̂_pᴺE] + type + position    q: the summary token, s: a sink
    z_ℓ = z_ℓ + MSA(LN(z_ℓ)),  z_ℓ = z_ℓ + MLP(LN(z_ℓ))       L pre-norm blocks
    answer = argmax head(LN(z_L^q))                            read from the question's summary token

The patch embedding ``x̂_p E`` is linear (``patch_stem="linear"``, the model's default) or two-level
(``"conv"``, :class:`ConvPatchStem`): ``GELU(conv_4×4/4(x̂))`` then a conv over the patch's 4 × 4 cells — an
animal's pixels are ``α ⊙ (colour − background)``, which a linear map turns into one vector bilinear in shape and
colour. ``"conv+colour"`` adds :class:`PatchColour`, the foreground's mean colour as its own 4 numbers.
``"shape+colour"`` (:class:`ShapeColourStem`) embeds the silhouette (colour-blind) and the colour (shape-blind)
apart and sums them; ``"shape,colour"`` (the ``vqa`` recipe's default) makes them **two tokens per patch**,
``[… ; s¹ … sᴺ ; c¹ … cᴺ]``, both with the patch's position, which in the first layer attend only to each other
(the question's tokens attend to all of them): a key is then pure shape or pure colour, and attention maps are
reported per patch (:meth:`VQATransformer.attention_maps`).

The answer (:class:`AnswerHead`) is a logit per answer (``answer_readout="class"``), or, with ``"points"``, a
count or a colour is read as a position in its space (a line, RGB): ``logit_a = g·h − s‖p̂ − p_a‖²``.

Row ``q`` of each layer's ``A = softmax(Q Kᵀ / √E)`` is where the question looks: its query is matched
against the keys of the patch tokens. Choices made for learning that routing in CPU minutes (the ``vqa``
recipe's docstring says which of them were measured, and how): the summary token starts as
the question's mean word embedding plus a learned vector (so the first layer's query already depends on
the question); pixels are standardized with the data's statistics, ``x̂ = (x − μ) / σ`` (the background, the
same in every patch, becomes ≈ 0); positions start at the scale of the content (``N(0, 0.5²)``, not ViT's
0.02). The sink ``s`` is a learned token any query can rest on, so that attention which picks ``k``
objects can tell how many — the construction of ``tokennet demo counting``, learned; ``sink_logit`` adds a
learned score per layer and head to it. Padding words are masked as keys. ``modality_mask="image-first"`` lets
the patches attend only to patches; ``"patch-local"`` only to their own patch's tokens, in every layer, so that
only the question's tokens look across the image; ``"summary-reads"`` leaves that to the summary token alone;
``read_layers`` says in which layers the question may look at all; ``"full"`` (the default) lets every token
attend to every token.

**The CNN baseline** (family ``vqa-cnn``) answers the same questions the way a CNN can: a GRU reads the
question, and FiLM (Perez et al. 2018, https://arxiv.org/abs/1709.07871) conditions every block of a conv
trunk on it — ``h ← (1 + γ(q)) ⊙ h + β(q)`` — followed by global average pooling and one linear layer
(:mod:`tokennet.models.cnn`). The question changes *what every filter computes*, but every unit still sees
only its receptive field, and the answer is the mean of the units' votes. ``readout="coords"`` appends two
coordinate channels to the image (as FiLM's own model does), so a unit's vote can depend on where it is:
the receptive-field sweep (``bench/vqa_receptive_field.py``) uses it, so that pooling is not what fails.
``readout="unit"`` pools nothing: strided convolutions take the picture's centred ``window`` down to one unit,
and the answer is that unit's (:mod:`tokennet.models.strided_cnn`; preset ``vqa-cnn-unit``): its receptive field
is the window, which a sweep varies from below the distance between two corners to the whole picture.
``readout="flatten"`` (the ``vqa`` recipe's baselines, presets ``vqa-cnn`` and ``vqa-cnn-shallow``) keeps every
unit: coordinate channels, then one linear map over the whole final map, as the classic CNN's
fully connected layer — a unit's vote has weights of its own, so a few units that see two far-apart objects are not
averaged away, and the two presets differ only in how many strided stages, so in field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.masks import padding
from ..dropout import Dropout
from ..errors import ConfigError
from ..layers.init import init_conv_weights, init_trunc_normal
from ..layers.stack import AttentionMaps, Encoder
from ..position.fourier import fourier_2d
from ..tokens.image import PatchEmbed, grid_size
from .cnn import ConvTrunk, ConvTrunkConfig, ReceptiveField, _norm
from .registry import CountsParameters, Output, TransformerConfig, register_family, register_preset
from .strided_cnn import StridedTrunk, check_window

__all__ = ["VQATransformerConfig", "VQATransformer", "VQACNNConfig", "VQACNN", "MODALITY_MASKS", "AnswerHead",
           "answer_points"]

MODALITY_MASKS = ("full", "image-first", "patch-local", "summary-reads")
PATCH_LOCAL = ("patch-local", "summary-reads")  # patches never attend to other patches
PATCH_STEMS = ("linear", "conv", "conv+colour", "shape+colour", "shape,colour")
PAIR_BINDINGS = ("both", "shape-reads-colour")
PATCH_POSITIONS = ("learned", "fourier")
CNN_READOUTS = ("flatten", "mean", "coords", "unit")  # flatten: the vqa baselines'
ANSWER_READOUTS = ("class", "points")


class AnswerHead(nn.Module):
    """Features ``(B, D)`` → answer logits ``(B, A)``.

    ``readout="class"``: one linear map, a logit per answer. ``readout="points"``: an answer that *means* a
    point — a count ``7`` the point 7 on a line, a colour its RGB value — is read as a position in that space:
    for each space ``S`` (the answers whose points have the same length: counts, colours), the model says where it
    is, ``p̂_S = W_S h``, and whether the answer is of that kind, ``g_S·h``:
    ``logit_a = g_S·h − s_S ‖p̂_S − p_a‖²`` (``s_S > 0``, learned); the other answers (*yes*, *no*, species) keep
    a linear logit each.

    Why: with a logit per class, an answer training never pairs with a question — *how many fish?* never
    answered ``7``, *what colour is the bird?* never ``purple`` (the held-out kinds) — gets its own learned
    "never" for that question, and the test's held-out pairs are answered at or below chance. With points, the
    only way to say 7 is ``k̂ ≈ 7``, for fish as for birds: a question can shift ``p̂`` but not veto one point
    without missing its neighbours — as the hand-built counter's ``1/(k+1)`` carries over to any ``k``."""

    def __init__(self, dim: int, num_answers: int, readout: str = "class", points=()):
        super().__init__()
        self.readout = readout
        if readout == "class":
            self.linear = nn.Linear(dim, num_answers)
            return
        if len(points) != num_answers:
            raise ConfigError(f"answer_readout='points' needs answer_points, a point or null for each of the "
                              f"{num_answers} answers (the vqa recipe fills them from the data), got {len(points)}")
        words = [j for j, v in enumerate(points) if v is None]
        sizes = sorted({len(v) for v in points if v is not None})
        groups = [[j for j, v in enumerate(points) if v is not None and len(v) == n] for n in sizes]
        # logits = cat([words, space 0, space 1, …])[:, order]: answer j's position in that concatenation
        order = torch.empty(num_answers, dtype=torch.long)
        order[torch.tensor(words + [j for group in groups for j in group], dtype=torch.long)] = \
            torch.arange(num_answers)
        self.register_buffer("order", order, persistent=False)
        self.linear = nn.Linear(dim, len(words))
        self.spaces = nn.ModuleList(nn.Linear(dim, n + 1) for n in sizes)  # (p̂_S, g_S)
        for i, group in enumerate(groups):  # points{i}: (A_S, n), space i's answers' points
            self.register_buffer(f"points{i}", torch.tensor([points[j] for j in group], dtype=torch.float32),
                                 persistent=False)
        self.log_sharpness = nn.Parameter(torch.zeros(len(sizes)))
        self.reset_points()

    def reset_points(self) -> None:
        """``p̂_S`` starts at the mean of the space's points whatever the input (call after a model-wide init)."""
        if self.readout == "points":
            for i, lin in enumerate(self.spaces):
                nn.init.zeros_(lin.weight)
                with torch.no_grad():
                    pts = getattr(self, f"points{i}")
                    lin.bias.copy_(torch.cat([pts.mean(0), pts.new_zeros(1)]))

    def position(self, h: Tensor, space: int = 0) -> Tensor:
        """``p̂_S`` ``(B, n)`` for space ``S`` (``readout="points"``; space 0 is the smallest, e.g. the counts)."""
        return self.spaces[space](h)[:, :-1]

    def forward(self, h: Tensor) -> Tensor:
        if self.readout == "class":
            return self.linear(h)
        parts = [self.linear(h)]
        for i, lin in enumerate(self.spaces):
            out = lin(h)
            where, bonus = out[:, :-1], out[:, -1:]  # (B, n), (B, 1)
            sq_dist = (where[:, None, :] - getattr(self, f"points{i}")).pow(2).sum(-1)  # (B, A_S)
            parts.append(bonus - self.log_sharpness[i].exp() * sq_dist)
        return torch.cat(parts, -1)[:, self.order]  # (B, A)

    def vote_weights(self, h: Tensor, answer: Tensor) -> Tensor:
        """``∂ logit_answer / ∂h`` at ``h`` ``(B, D)``: a class's weight row, or the gradient of a point's logit
        (its linear part around ``h``: what a unit's features add to the answer, for a class activation map)."""
        if self.readout == "class":
            return self.linear.weight[answer]
        leaf = h.detach().requires_grad_(True)
        with torch.enable_grad():
            logit = self.forward(leaf).gather(1, answer[:, None]).sum()
            (grad,) = torch.autograd.grad(logit, leaf)
        return grad


def _check_readout(config) -> None:
    config._choice("answer_readout", config.answer_readout, ANSWER_READOUTS)
    pts = config.answer_points = [list(v) if isinstance(v, (list, tuple)) else v for v in config.answer_points]
    if config.answer_readout == "points" and pts:  # empty: not filled yet (the recipe fills them from the data)
        ok = len(pts) == config.num_answers and all(
            v is None or (len(v) > 0 and all(isinstance(x, (int, float)) for x in v)) for v in pts)
        if not ok:
            raise ConfigError(f"answer_readout='points' needs answer_points: a list of numbers or null per answer "
                              f"({config.num_answers}), got {pts!r}")
        sizes = [len(v) for v in pts if v is not None]
        if not sizes or min(sizes.count(n) for n in set(sizes)) < 2:
            raise ConfigError("answer_readout='points' needs at least two answers in each space of points")


def answer_points(answers, colours: dict | None = None) -> list[list[float] | None]:
    """Each answer's point, the ``answer_points`` setting: a whole number ``"7"`` → ``[7.0]``; a colour name in
    ``colours`` (name → RGB) → its RGB; anything else None."""
    colours = colours or {}
    return [[float(answer)] if answer.isdigit() else list(map(float, colours[answer])) if answer in colours else None
            for answer in answers]


class ConvPatchStem(nn.Module):
    """A two-level patch embedding: ``x → GELU(conv_{s×s, stride s}(x)) → conv_{p/s × p/s, stride p/s}``,
    images ``(B, C, H, W)`` → tokens ``(B, N, D)`` row-major, one per ``p × p`` patch (``s = 4`` when it divides
    ``p``, else 2 or 1). The first layer's units see ``s × s`` pixels and, through the nonlinearity, can tell
    "this much red here" from "this shape here"; a linear embedding ``x_p E`` cannot: an animal's pixels are
    ``α ⊙ (colour − background)``, so ``x_p E`` is bilinear in shape ``α`` and colour, one vector for both."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, hidden: int):
        super().__init__()
        sub = next(size for size in (4, 2, 1) if patch_size % size == 0)
        self.conv1 = nn.Conv2d(in_channels, hidden, sub, sub)
        self.conv2 = nn.Conv2d(hidden, dim, patch_size // sub, patch_size // sub)

    def forward(self, x: Tensor) -> Tensor:
        feats = self.conv2(F.gelu(self.conv1(x)))  # (B, D, H/p, W/p)
        return feats.flatten(2).transpose(1, 2)  # (B, N, D)


class PatchColour(nn.Module):
    """A patch's colour, apart from its shape: with ``w = ‖x̂_pixel‖`` (standardized pixels: ≈ 0 on the
    background), the foreground's mean colour ``Σ w x̂ / Σ w`` (3 numbers, whatever the shape) and how much of the
    patch is foreground, ``mean w`` — 4 numbers per patch, embedded by one linear map: ``(B, C, H, W) → (B, N, D)``."""

    def __init__(self, in_channels: int, dim: int, patch_size: int):
        super().__init__()
        self.p = patch_size
        self.proj = nn.Linear(in_channels + 1, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(_patch_colour(x, x.norm(dim=1, keepdim=True), self.p))


def _patch_colour(x: Tensor, w: Tensor, p: int) -> Tensor:
    """Per ``p × p`` patch, the ``w``-weighted mean colour ``Σ w x / Σ w`` and the mean weight: ``x (B, C, H, W)``,
    ``w (B, 1, H, W)`` → ``(B, N, C + 1)`` row-major."""
    mass = F.avg_pool2d(w, p)  # (B, 1, H/p, W/p)
    colour = F.avg_pool2d(w * x, p) / mass.clamp_min(1e-3)  # (B, C, H/p, W/p)
    return torch.cat([colour, mass], 1).flatten(2).transpose(1, 2)
class ShapeColourStem(nn.Module):
    """A patch embedding that keeps **shape and colour apart**: ``shape(f) + colour``.

    With ``b`` the picture's background (its per-channel median over every 4th pixel of every 4th row: the
    colour most of the picture has, read from a sixteenth of the pixels) and ``d =
    x − b`` in raw pixel units, ``f = min(‖d‖ / τ, 1)`` is how much a pixel is *not background* — 1 on an
    animal whatever its colour (``τ`` = ``threshold``), so a :class:`ConvPatchStem` over ``f`` alone sees the
    silhouette and nothing of the colour; the colour enters through :class:`PatchColour`-like features, the
    foreground's mean standardized colour ``Σ f x̂ / Σ f`` and its share ``mean f``, which carry no shape. A red
    bird's token is then (bird shape) + (red): a kind training never showed is two parts it did, where a conv
    over ``x̂`` binds them into one vector that is new as a whole."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, hidden: int, std, threshold: float = 0.3):
        super().__init__()
        self.p, self.threshold = patch_size, threshold
        self.register_buffer("std", torch.tensor([float(v) for v in std])[:, None, None], persistent=False)
        self.shape = ConvPatchStem(1, dim, patch_size, hidden)
        self.colour = nn.Linear(in_channels + 1, dim)

    def foreground(self, x: Tensor) -> Tensor:
        """``f`` ``(B, 1, H, W)`` in [0, 1] from standardized images ``x̂`` ``(B, C, H, W)``."""
        background = x[:, :, ::4, ::4].flatten(2).median(-1).values[:, :, None, None]  # (B, C, 1, 1): the background
        diff = (x - background) * self.std  # raw pixel units
        # (Σ d²)^½ by hand: torch's vector norm over the 3 channels took 23 ms a call in a profile of a training step
        return (diff * diff).sum(1, keepdim=True).sqrt().div(self.threshold).clamp(max=1.0)

    def parts(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(shape, colour)`` embeddings ``(B, N, D)`` each, of standardized images ``(B, C, H, W)``."""
        fore = self.foreground(x)  # (B, 1, H, W)
        return self.shape(fore), self.colour(_patch_colour(x, fore, self.p))

    def forward(self, x: Tensor) -> Tensor:
        shape, colour = self.parts(x)
        return shape + colour  # (B, N, D)


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


# Neutral defaults; a recipe sets the data's own statistics (tokennet.data.vqa.pixel_stats).
PIXEL_MEAN = [0.5, 0.5, 0.5]
POSITION_STD = 0.5
PIXEL_STD = [0.25, 0.25, 0.25]


def _example(config, batch_size: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(batch_size, config.in_channels, config.image_size, config.image_size, generator=gen)
    questions = torch.randint(1, config.vocab_size, (batch_size, config.max_question_len), generator=gen)
    questions[:, config.max_question_len // 2:] = 0  # padding after the words
    return images, questions


def _check_inputs(config, inputs) -> tuple[Tensor, Tensor]:
    if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2):
        raise ValueError("a question-answering model takes (images (B, 3, H, W), questions (B, T)) as one pair")
    images, questions = inputs
    cfg = config
    if images.dim() != 4 or tuple(images.shape[1:]) != (cfg.in_channels, cfg.image_size, cfg.image_size):
        raise ValueError(f"images must be (B, {cfg.in_channels}, {cfg.image_size}, {cfg.image_size}), got "
                         f"{tuple(images.shape)}")
    if questions.dim() != 2 or questions.shape[0] != images.shape[0] or questions.shape[1] > cfg.max_question_len:
        raise ValueError(f"questions must be word ids (B, T ≤ {cfg.max_question_len}) for the B images, got "
                         f"{tuple(questions.shape)}")
    return images, questions


@dataclass
class VQATransformerConfig(TransformerConfig, defaults=dict(dim=64, num_layers=3, mlp_ratio=2.0)):
    """Config of :class:`VQATransformer`.

    Args:
        image_size: square images of ``image_size`` pixels; ``patch_size`` must divide it.
        patch_size: side of the square patches (one token each).
        in_channels: image channels.
        vocab_size: question words (id 0 is padding).
        num_answers: answer classes.
        max_question_len: most words in a question.
        dim, num_layers, num_heads, mlp_ratio, dropout: the encoder.
        modality_mask: ``"full"``; ``"image-first"`` (patches attend only to patches); ``"patch-local"`` (a
            patch's tokens attend only to each other, in every layer: only the question's tokens look across the
            image); ``"summary-reads"`` (that, and of the question's tokens only the summary token meets patch
            keys: the words and the sink attend to the question alone).
        read_layers: the layers in which the question's tokens may attend to the patches (``None``: all); in the
            others they attend to the question alone.
        pair_binding: with two tokens per patch, where a patch's tokens may look at each other: ``"both"`` (each
            takes in the other half) or ``"shape-reads-colour"`` (the shape token takes in its colour; the colour
            token attends only to itself and stays a function of the colour alone, so a held-out kind's colour
            token is one training saw).
        patch_positions: the patches' positions: ``"learned"`` (one vector per patch, trained) or ``"fourier"``
            (the fixed 2-D sin-cos features of the patch's row and column,
            :func:`~tokennet.position.fourier.fourier_2d`: the lecture's "Fourier coefficients associated with that
            position"; needs ``dim`` divisible by 4).
        sink_logit: with a sink, a learned score per layer and head added to every query's score on the sink,
            starting at this value (``None``: none, the sink's score is its key's alone) — a place to rest that
            every head has from the start, as the hand-built counter's sink is.
        patch_stem: ``"linear"`` (``x_p E``), ``"conv"`` (:class:`ConvPatchStem`), ``"conv+colour"`` (that
            plus :class:`PatchColour`) or ``"shape+colour"`` (:class:`ShapeColourStem`: a conv over the
            silhouette plus the colour, apart) or ``"shape,colour"`` (the same two parts as **two tokens** per
            patch, each with the patch's position: a question's query meets a colour key that holds no shape; in
            the first layer a patch's two tokens attend only to each other).
        stem_channels: the conv stem's hidden channels.
        sink: a learned sink token after the summary token: a key every query can put weight on, so that
            attention that picks ``k`` objects among the patches can say how many (its weight on the sink
            falls as ``k`` grows; see ``tokennet demo counting``, where the same trick is built by hand).
        pixel_mean, pixel_std: per-channel statistics the images are standardized with (from the data).
        label_smoothing: the loss's label smoothing.
        answer_readout: ``"class"`` (a logit per answer) or ``"points"`` (counts and colours read as a position in
            their space, :class:`AnswerHead`).
        answer_points: each answer's point (``[7]`` for a count, RGB for a colour) or null (from the data).
        backend: attention backend.
    """

    image_size: int = 64
    patch_size: int = 16
    in_channels: int = 3
    vocab_size: int = 32
    num_answers: int = 17
    max_question_len: int = 12
    modality_mask: str = "full"
    sink: bool = True
    patch_stem: str = "linear"
    stem_channels: int = 32
    pixel_mean: list[float] = field(default_factory=lambda: list(PIXEL_MEAN))
    pixel_std: list[float] = field(default_factory=lambda: list(PIXEL_STD))
    label_smoothing: float = 0.0
    answer_readout: str = "class"
    answer_points: list = field(default_factory=list)
    sink_logit: float | None = None
    read_layers: list[int] | None = None
    pair_binding: str = "both"
    patch_positions: str = "learned"

    def __post_init__(self):
        self.family = "vqa-transformer"
        _check_pixels(self)
        _check_readout(self)
        self._positive(image_size=self.image_size, patch_size=self.patch_size, in_channels=self.in_channels,
                       vocab_size=self.vocab_size, num_answers=self.num_answers,
                       max_question_len=self.max_question_len, dim=self.dim, num_layers=self.num_layers,
                       num_heads=self.num_heads)
        self._choice("modality_mask", self.modality_mask, MODALITY_MASKS)
        self._choice("patch_stem", self.patch_stem, PATCH_STEMS)
        self._choice("pair_binding", self.pair_binding, PAIR_BINDINGS)
        self._choice("patch_positions", self.patch_positions, PATCH_POSITIONS)
        if self.patch_positions == "fourier" and self.dim % 4:
            raise ConfigError(f"patch_positions='fourier' needs dim divisible by 4 (sin and cos of the row and the "
                              f"column), got dim={self.dim}")
        self._positive(stem_channels=self.stem_channels)
        self._mlp_and_backend()
        self._fraction(dropout=self.dropout, label_smoothing=self.label_smoothing)
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if self.sink_logit is not None and (not self.sink or isinstance(self.sink_logit, bool)
                                            or not isinstance(self.sink_logit, (int, float))):
            raise ConfigError(f"sink_logit must be a number (the sink's learned score starts there) and needs "
                              f"sink=true, got sink_logit={self.sink_logit!r}, sink={self.sink}")
        if self.read_layers is not None:
            self.read_layers = list(self.read_layers)
            if not self.read_layers or not all(isinstance(i, int) and not isinstance(i, bool)
                                               and 0 <= i < self.num_layers for i in self.read_layers):
                raise ConfigError(f"read_layers must be a non-empty list of layer indices in 0..{self.num_layers - 1}"
                                  f" (num_layers={self.num_layers}), got {self.read_layers!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")

    @property
    def grid(self) -> tuple[int, int]:
        return grid_size(self.image_size, self.patch_size)

    @property
    def num_patches(self) -> int:
        grid_h, grid_w = self.grid
        return grid_h * grid_w

    @property
    def tokens_per_patch(self) -> int:
        """Image tokens per patch: 2 with ``patch_stem="shape,colour"`` (its shape and its colour), else 1."""
        return 2 if self.patch_stem == "shape,colour" else 1

    @property
    def num_text(self) -> int:
        """Question positions: the summary token, the sink (if any) and ``max_question_len`` words."""
        return 1 + int(self.sink) + self.max_question_len


class VQATransformer(CountsParameters, nn.Module):
    """``forward((images (B, 3, H, W), questions (B, T)), answers=None) → Output(logits (B, A), loss)``.

    Token order: the summary token ``q`` (index 0), the sink (index 1, when ``sink``), the
    ``max_question_len`` word slots, then the patches row-major (index ``num_text + n`` is patch ``n``).
    """

    def __init__(self, config: VQATransformerConfig):
        super().__init__()
        self.config = cfg = config
        if cfg.patch_stem == "linear":
            self.patch_embed = PatchEmbed(cfg.in_channels, cfg.dim, cfg.patch_size)
        elif cfg.patch_stem in ("shape+colour", "shape,colour"):
            self.patch_embed = ShapeColourStem(cfg.in_channels, cfg.dim, cfg.patch_size, cfg.stem_channels,
                                               cfg.pixel_std)
        else:
            self.patch_embed = ConvPatchStem(cfg.in_channels, cfg.dim, cfg.patch_size, cfg.stem_channels)
        self.patch_colour = (PatchColour(cfg.in_channels, cfg.dim, cfg.patch_size) if cfg.patch_stem == "conv+colour"
                             else None)
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=0)
        self.summary = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.sink = nn.Parameter(torch.randn(1, 1, cfg.dim) * POSITION_STD) if cfg.sink else None
        # a learned score per layer and head added to every query's score on the sink (sink_logit: its start);
        # flat, so that it is not decayed as a matrix
        self.sink_logit = (nn.Parameter(torch.full((cfg.num_layers * cfg.num_heads,), float(cfg.sink_logit)))
                           if cfg.sink and cfg.sink_logit is not None else None)
        self.type_emb = nn.Parameter(torch.zeros(2, cfg.dim))  # 0: question, 1: image
        # with two tokens per patch, which part a token is (0: shape, 1: colour)
        self.part_emb = nn.Parameter(torch.zeros(2, cfg.dim)) if cfg.tokens_per_patch == 2 else None
        self.text_pos = nn.Parameter(torch.zeros(cfg.num_text, cfg.dim))
        if cfg.patch_positions == "fourier":  # fixed, not learned: a buffer the checkpoint need not hold
            self.register_buffer("patch_pos", fourier_2d(*cfg.grid, cfg.dim), persistent=False)
        else:
            self.patch_pos = nn.Parameter(torch.zeros(cfg.num_patches, cfg.dim))
        self.drop = Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="pre",
                               dropout=cfg.dropout, activation="gelu", backend=cfg.backend, value_proj=cfg.value_proj)
        self.head = AnswerHead(cfg.dim, cfg.num_answers, cfg.answer_readout, cfg.answer_points)
        for param in (self.summary, self.type_emb, self.part_emb):
            if param is not None:
                nn.init.normal_(param, 0.0, 0.02)
        # Positions start as large as the content (words: N(0, 1), standardized patches: about as much), not at
        # ViT's 0.02: a question about the top right corner must be able to find it from the first steps.
        for param in (self.text_pos, self.patch_pos):
            if isinstance(param, nn.Parameter):
                nn.init.normal_(param, 0.0, POSITION_STD)
        self.apply(init_trunc_normal)
        self.head.reset_points()

    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        return _example(self.config, batch_size)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        return torch.randint(self.config.num_answers, (batch_size,), generator=torch.Generator().manual_seed(1))

    def _tokens(self, inputs) -> tuple[Tensor, Tensor]:
        """``(tokens (B, L, D), mask (B, 1, L, L) or (B, 1, 1, L))`` with ``L = num_text + num_patches``."""
        cfg = self.config
        images, questions = _check_inputs(cfg, inputs)
        B, T = questions.shape
        if T < cfg.max_question_len:  # pad to the fixed slots (positions are per slot)
            questions = F.pad(questions, (0, cfg.max_question_len - T))
        words = self.word_emb(questions)  # (B, T, D)
        # The summary token starts as the question's bag of words, so the first layer can already look for what
        # the question asks (a learned constant alone would make its first query the same for every question).
        n_words = (questions != 0).sum(1, keepdim=True).clamp_min(1)  # (B, 1)
        bag = (words.sum(1) / n_words)[:, None]  # (B, 1, D)
        head = [self.summary + bag] + ([self.sink.expand(B, 1, -1)] if self.sink is not None else [])
        text = torch.cat([*head, words], 1) + self.text_pos + self.type_emb[0]  # (B, num_text, D)
        x = _standardize(cfg, images)
        if self.part_emb is not None:  # two tokens per patch: its shape, then (after all shapes) its colour
            shape, colour = self.patch_embed.parts(x)  # (B, N, D) each
            where = self.patch_pos + self.type_emb[1]
            patches = torch.cat([shape + where + self.part_emb[0], colour + where + self.part_emb[1]], 1)  # (B, 2N, D)
        else:
            patches = self.patch_embed(x) + self.patch_pos + self.type_emb[1]  # (B, N, D)
        if self.patch_colour is not None:
            patches = patches + self.patch_colour(x)
        z = torch.cat([text, patches], 1)  # (B, L, D)
        is_pad = torch.cat([torch.zeros(B, len(head), dtype=torch.bool, device=z.device), questions == 0,
                            torch.zeros(B, patches.shape[1], dtype=torch.bool, device=z.device)], 1)  # (B, L)
        mask = padding(is_pad)  # (B, 1, 1, L): nobody attends to padding words
        n_text, L = cfg.num_text, z.shape[1]
        if cfg.modality_mask != "full":
            allowed = torch.ones(L, L, dtype=torch.bool, device=z.device)
            allowed[n_text:, :n_text] = False  # a patch's query never meets a question key
            if cfg.modality_mask == "summary-reads":
                # the sink's and the words' queries never meet a patch key: only q reads
                allowed[1:n_text, n_text:] = False
            mask = mask & allowed  # (B, 1, L, L)
        if self.part_emb is not None or cfg.modality_mask in PATCH_LOCAL:
            # A patch's own tokens only (its two tokens attend to each other: each takes in the other half; the
            # question's tokens attend to all, and meet keys that are pure shape or pure colour): in the first
            # layer, then all (image-first) or in every layer (patch-local, summary-reads).
            N = cfg.num_patches
            allowed = torch.ones(L, L, dtype=torch.bool, device=z.device)
            own = torch.eye(N, dtype=torch.bool, device=z.device).repeat(cfg.tokens_per_patch, cfg.tokens_per_patch)
            if cfg.pair_binding == "shape-reads-colour" and cfg.tokens_per_patch == 2:
                own[N:, :N] = False  # a colour token's query never meets its shape's key: it stays pure colour
            allowed[n_text:] = False
            allowed[n_text:, n_text:] = own  # (tN, tN): the same patch
            local = mask & allowed
            mask = ([local] * cfg.num_layers if cfg.modality_mask in PATCH_LOCAL
                    else [local] + [mask] * (cfg.num_layers - 1))
        if cfg.read_layers is not None:  # the question's tokens meet patch keys only in these layers
            blind = torch.ones(L, L, dtype=torch.bool, device=z.device)
            blind[:n_text, n_text:] = False
            masks = mask if isinstance(mask, list) else [mask] * cfg.num_layers
            mask = [m if i in cfg.read_layers else m & blind for i, m in enumerate(masks)]
        return self.drop(z), mask

    def forward_features(self, inputs, *, return_attention: bool = False):
        """Final tokens ``(B, L, D)`` (with ``return_attention``: ``(tokens, per-layer weights)``)."""
        z, mask = self._tokens(inputs)
        bias = None
        if self.sink_logit is not None:  # (1, H, 1, L) per layer: the sink's column only
            col = F.one_hot(torch.tensor(1, device=z.device), z.shape[1]).to(z.dtype)  # (L,)
            bias = [(sink[:, None] * col)[None, :, None, :]
                    for sink in self.sink_logit.view(self.config.num_layers, -1)]
        return self.encoder(z, mask=mask, bias=bias, return_weights=return_attention)

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
        """Every layer's ``A = softmax(Q Kᵀ / √E)``: ``{"self": [(B, H, L, L)] * num_layers}`` (plain formula),
        ``L = num_text + num_patches``. With two tokens per patch (``patch_stem="shape,colour"``) the maps are
        per patch: a patch's column is the sum of its two tokens' columns (the weight on the patch) and its row the
        mean of their rows, so every row still sums to 1 and patch ``n`` is index ``num_text + n`` as always."""
        _, maps = self.forward_features(inputs, return_attention=True)
        maps = [m["self"] for m in maps]
        if self.config.tokens_per_patch == 2:
            maps = [_per_patch(amap, self.config.num_text, self.config.num_patches) for amap in maps]
        return {"self": maps}

    def question_attention(self, inputs) -> list[Tensor]:
        """Per layer, the summary token's attention over the patches ``(B, H, N)`` (its row of ``A``,
        the patch columns; the rest of the row went to the question's own tokens)."""
        n = self.config.num_text
        return [amap[:, :, 0, n:] for amap in self.attention_maps(inputs)["self"]]


def _per_patch(a: Tensor, nt: int, n: int) -> Tensor:
    """``(…, nt + 2n, nt + 2n)`` attention over text, shape and colour tokens → ``(…, nt + n, nt + n)`` over text
    and patches: columns of a patch's two tokens summed, their rows averaged."""
    cols = torch.cat([a[..., :nt], a[..., nt:nt + n] + a[..., nt + n:]], -1)  # (…, nt + 2n, nt + n)
    return torch.cat([cols[..., :nt, :], (cols[..., nt:nt + n, :] + cols[..., nt + n:, :]) / 2], -2)


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
        readout: ``"mean"`` (global average pooling, then linear: where a unit is, is lost), ``"coords"``
            (two coordinate channels, ``y`` and ``x`` in [−1, 1], appended to the image as FiLM's own model
            does — every unit knows where its field is — then the same pooling) or ``"unit"`` (no pooling: an
            all-convolutional trunk strided down to one unit that sees the centred ``window``,
            :class:`~tokennet.models.strided_cnn.StridedTrunk`; ``depths[i]`` blocks per scale, the last the
            strided reduction; needs a patchify stem) or ``"flatten"`` (the classic CNN's fully connected readout,
            as LeNet's and VGG's: the coordinate channels, then one linear map over every unit of the final map,
            ``logit_a = Σ_p W_{a,p} · h_p`` — each position has its own weights, so the few units whose field holds
            two far-apart objects are read, not averaged away among those that hold one; the answer is still a sum
            of local votes, so a field that never holds both objects cannot compare them).
        window: with ``readout="unit"``, the pixels the one unit sees (its receptive field), centred on the
            picture; ``None``: the whole picture.
        head_layers: 1×1 conv → norm → ReLU layers between the trunk and the readout: depth that does not
            change the receptive field.
        answer_readout, answer_points: as for the transformer (:class:`AnswerHead`).
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
    readout: str = "mean"
    window: int | None = None
    head_layers: int = 0
    answer_readout: str = "class"
    answer_points: list = field(default_factory=list)

    def __post_init__(self):
        self.family = "vqa-cnn"
        self._check_trunk(one_per_stage=self.readout != "unit")  # the strided trunk's lists are per scale
        _check_readout(self)
        self._choice("readout", self.readout, CNN_READOUTS)
        if self.readout == "unit":
            check_window(self, self.image_size if self.window is None else self.window, self.image_size)
        elif self.window is not None:
            raise ConfigError(f"window={self.window} is the field of readout='unit'; with readout="
                              f"{self.readout!r} leave it unset (a unit's field is set by the layers)")
        if isinstance(self.head_layers, bool) or not isinstance(self.head_layers, int) or self.head_layers < 0:
            raise ConfigError(f"head_layers must be a whole number >= 0, got {self.head_layers!r}")
        _check_pixels(self)
        self._positive(image_size=self.image_size, vocab_size=self.vocab_size, num_answers=self.num_answers,
                       max_question_len=self.max_question_len, word_dim=self.word_dim,
                       question_dim=self.question_dim)
        self._fraction(label_smoothing=self.label_smoothing)


class VQACNN(CountsParameters, nn.Module):
    """``forward((images, questions), answers=None) → Output(logits, loss)``: GRU → FiLM → conv trunk → GAP →
    linear (``readout="unit"``: the trunk's one unit → linear)."""

    def __init__(self, config: VQACNNConfig):
        super().__init__()
        self.config = cfg = config
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        self.gru = nn.GRU(cfg.word_dim, cfg.question_dim, batch_first=True)
        coords = cfg.readout in ("coords", "flatten")
        trunk = {dc_field.name: getattr(cfg, dc_field.name) for dc_field in fields(ConvTrunkConfig) if dc_field.init}
        if cfg.readout == "unit":
            self.trunk = StridedTrunk(cfg, cfg.image_size if cfg.window is None else cfg.window, cfg.image_size)
        else:
            self.trunk = ConvTrunk(ConvTrunkConfig(**{**trunk, "in_channels": cfg.in_channels + 2}) if coords
                                   else cfg)
        self.channels = self.trunk.film_channels()
        self.film = nn.Linear(cfg.question_dim, 2 * sum(self.channels))
        width = self.trunk.out_channels
        self.head_layers = nn.Sequential(*(nn.Sequential(nn.Conv2d(width, width, 1, bias=cfg.norm == "none"),
                                                         _norm(cfg.norm, width), nn.ReLU())
                                           for _ in range(cfg.head_layers)))
        self.map_side = _map_side(self.trunk, cfg.image_size)  # the final map is map_side × map_side units
        votes = self.trunk.out_channels * (self.map_side ** 2 if cfg.readout == "flatten" else 1)
        self.head = AnswerHead(votes, cfg.num_answers, cfg.answer_readout, cfg.answer_points)
        self.apply(init_conv_weights)
        self.head.reset_points()
        # channels-last: oneDNN's convolutions skip a layout reorder each way (6–19 % less per training step of the
        # two vqa CNNs, 1 thread, measured on a loaded machine)
        self.trunk.to(memory_format=torch.channels_last)
        nn.init.zeros_(self.film.weight)  # start as the unconditioned trunk: γ = β = 0
        nn.init.zeros_(self.film.bias)

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
        gamma_beta = self.film(self.encode_question(questions))  # (B, 2 ΣC)
        out, i = [], 0
        for width in self.channels:
            out.append((gamma_beta[:, i:i + width], gamma_beta[:, i + width:i + 2 * width]))
            i += 2 * width
        return out

    def forward_features(self, inputs) -> Tensor:
        """The conditioned feature map ``(B, C', H', W')``."""
        images, questions = _check_inputs(self.config, inputs)
        x = _standardize(self.config, images)
        if self.config.readout in ("coords", "flatten"):
            B, _, H, W = x.shape
            grid_y = torch.linspace(-1, 1, H, device=x.device)[:, None].expand(H, W)
            grid_x = torch.linspace(-1, 1, W, device=x.device)[None, :].expand(H, W)
            x = torch.cat([x, torch.stack([grid_y, grid_x])[None].expand(B, 2, H, W)], 1)  # (B, C + 2, H, W)
        feats = self.trunk(x.contiguous(memory_format=torch.channels_last), self.films(questions))
        return self.head_layers(feats)  # (B, C', H', W'); (B, C', 1, 1) with readout="unit"

    def forward_head(self, h: Tensor) -> Tensor:
        return self.head(self._readout(h))  # (B, A)

    def _readout(self, h: Tensor) -> Tensor:
        """The feature map ``(B, C', H', W')`` → what the answer head reads: every unit in order (``flatten``:
        ``(B, C'·H'·W')``), else their mean ``(B, C')`` (the one unit's features, with ``unit``)."""
        return h.flatten(1) if self.config.readout == "flatten" else h.mean((2, 3))

    def forward(self, inputs, targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(inputs))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.config.label_smoothing)
        return Output(logits, loss)

    def answer_map(self, inputs, answer: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Each unit's vote for the answer (a class activation map): ``(maps (B, H', W'), answers (B,))``."""
        feats = self.forward_features(inputs)
        if answer is None:
            answer = self.forward_head(feats).argmax(-1)
        weights = self.head.vote_weights(self._readout(feats), answer)  # (B, C') or, flatten, (B, C'·H'·W')
        if self.config.readout == "flatten":  # each unit's own weights: its vote is its term of the logit
            return (weights.view_as(feats) * feats).sum(1), answer
        return torch.einsum("bc,bchw->bhw", weights, feats), answer


def _map_side(trunk: nn.Module, image_size: int) -> int:
    """The side of the trunk's output map for a square picture of ``image_size`` pixels: each convolution of its
    longest path maps ``n`` to ``(n + 2·pad − dilation·(k − 1) − 1) // stride + 1`` (the shortcuts keep the size)."""
    if not hasattr(trunk, "layer_specs"):  # the strided trunk ends in one unit
        return 1
    side = image_size
    for (kernel, stride, dilation), pad in zip(*trunk.layer_specs(), strict=True):
        side = (side + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    return side


register_family("vqa-transformer", VQATransformerConfig, VQATransformer)
register_family("vqa-cnn", VQACNNConfig, VQACNN)
register_preset("vqa-transformer", "vqa-transformer", "answers questions about 64×64 pictures: [question; sink; "
                "16×16 patches] in one encoder, 3 layers × 64, the answer read from the question's summary token")
register_preset("vqa-generic", "vqa-transformer", "the lecture's transformer for vqa: question words and linear 16×16 "
                "patch embeddings (learned positions) in one sequence, full self-attention, pre-norm blocks, the "
                "answer read from the summary token by one linear map; no mask, stem, readout or sink made for the "
                "task",
                sink=False)
# The two CNN baselines of ``tokennet train vqa``: one family, differing only in field. A 4×4 patchify stem, then plain
# 3×3 stages, each after the first at stride 2 and twice as wide, so a unit's field doubles per stage (12, 20, 36,
# 68 px); the coordinate channels; the answer read from every unit of the final map by one linear map.
FIELD_FAMILY = {"arch": "plain", "stem_kernel": 4, "stem_stride": 4, "readout": "flatten"}
FIELD_FAMILY_WIDTHS = [16, 32, 64, 128]  # four stages: about the generic transformer's parameters
register_preset("vqa-cnn", "vqa-cnn", "the CNN baseline for vqa whose units see the whole picture: GRU question → "
                "FiLM on a 4×4 patchify stem and four plain 3×3 stages of 16/32/64/128 channels, each after the first "
                "at stride 2 (a 68-pixel field), coordinate channels, the answer read from every unit of the 2×2 map "
                "by one linear map", **FIELD_FAMILY, widths=FIELD_FAMILY_WIDTHS, depths=[1] * 4)
register_preset("vqa-cnn-shallow", "vqa-cnn", "the CNN baseline for vqa whose units cannot see two corners: vqa-cnn "
                "without its last stage (a 36-pixel field, less than the 48 pixels from one corner cell to the next; "
                "the answer read from every unit of the 4×4 map)", **FIELD_FAMILY,
                widths=FIELD_FAMILY_WIDTHS[:3], depths=[1] * 3)
register_preset("vqa-cnn-resnet", "vqa-cnn", "the vqa baseline before the field family: GRU question → FiLM on a "
                "small ResNet (4×4 patchify stem, stages 20/40/80; a 92-pixel receptive field covers the 64×64 "
                "image), GAP + linear", stem_kernel=4, stem_stride=4, widths=[20, 40, 80], depths=[1, 1, 1])
register_preset("vqa-cnn-unit", "vqa-cnn", "an all-convolutional CNN for vqa: FiLM on a 4×4 patchify stem and "
                "strided convolutions down to one unit that sees the whole 64×64 picture; the answer is read from it "
                "(no pooling)", readout="unit", arch="plain", stem_kernel=4, stem_stride=4, widths=[32, 64, 96, 128],
                depths=[1])
register_preset("vqa-cnn-local", "vqa-cnn", "the shallow vqa baseline before the field family: FiLM on two conv "
                "layers after a 4×4 patchify stem (a 20-pixel receptive field: no unit sees two corners of the 64×64 "
                "image), GAP + linear", arch="plain", stem_kernel=4, stem_stride=4, widths=[64, 112], depths=[1, 1])
