"""Modality → tokens: the only modality-specific step before the generic transformer."""

# pretrained and sentencepiece register their saved kinds with tokens.text (tokenizer_from_dict reads them)
from tokennet.tokens import pretrained, sentencepiece  # noqa: F401
from tokennet.tokens.chat_template import check_chat_template, render_chat_template
from tokennet.tokens.image import EMBED_MODES, ConvStem, PatchEmbed, grid_size, patch_padding, patchify
from tokennet.tokens.text import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    PATTERNS,
    SPECIAL_TOKENS,
    TOKENIZER_KINDS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
    train_tokenizer,
)

__all__ = [
    "PatchEmbed",
    "ConvStem",
    "patchify",
    "grid_size",
    "patch_padding",
    "EMBED_MODES",
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "BPETokenizer",
    "CharTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
    "train_tokenizer",
    "render_chat_template",
    "check_chat_template",
]
