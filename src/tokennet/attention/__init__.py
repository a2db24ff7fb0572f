"""Attention: masks, the attention function and its backends, scoring functions, pooling, multi-head."""

from .functional import BACKENDS, attention, masked_softmax
from .masks import adjacency, causal, padding, prefix, valid_lengths
from .multihead import KVCache, MultiHeadAttention
from .pooling import AttentionPooling, average_pooling, nadaraya_watson
from .scores import (
    SCORES,
    AdditiveScore,
    BoxcarKernel,
    DotProductScore,
    GaussianKernel,
    LaplaceKernel,
    Score,
    score_function,
)

__all__ = [
    "causal",
    "valid_lengths",
    "padding",
    "prefix",
    "adjacency",
    "attention",
    "masked_softmax",
    "BACKENDS",
    "MultiHeadAttention",
    "KVCache",
    "Score",
    "DotProductScore",
    "AdditiveScore",
    "GaussianKernel",
    "LaplaceKernel",
    "BoxcarKernel",
    "SCORES",
    "score_function",
    "nadaraya_watson",
    "AttentionPooling",
    "average_pooling",
]
