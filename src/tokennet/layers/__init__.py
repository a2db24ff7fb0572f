"""Transformer layers: the position-wise MLP (plain or gated), norms, the block (pre/post-norm), the token mixer,
stacks; inference copies (quantize, blockquant)."""

from .block import MIXERS, NORMS, Block
from .mixer import TokenMixing
from .mlp import ACTIVATIONS, MLP, GatedMLP
from .norm import Norm
from .stack import Decoder, Encoder

__all__ = ["MLP", "GatedMLP", "Norm", "ACTIVATIONS", "Block", "NORMS", "MIXERS", "TokenMixing", "Encoder", "Decoder"]
