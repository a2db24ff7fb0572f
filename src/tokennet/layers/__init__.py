"""Transformer layers: the position-wise MLP, the block (pre/post-norm), the token mixer, stacks."""

from .block import MIXERS, NORMS, Block
from .mixer import TokenMixing
from .mlp import ACTIVATIONS, MLP
from .stack import Decoder, Encoder

__all__ = ["MLP", "ACTIVATIONS", "Block", "NORMS", "MIXERS", "TokenMixing", "Encoder", "Decoder"]
