"""Position encodings, one module per encoding.

Additive encodings (sinusoidal, learned, 2-D Fourier, spherical harmonics, Laplacian) are added where
tokens are embedded; rotary (RoPE) and bias (ALiBi) encodings are computed once per forward and passed
down to the attention layers.
"""

from tokennet.position.alibi import ALiBi, alibi_bias, alibi_slopes
from tokennet.position.fourier import Fourier2DPosition, fourier_2d, random_fourier_features
from tokennet.position.laplacian import (
    CommuteTimePosition,
    LaplacianPosition,
    SpectralKernelBias,
    laplacian_eigenvectors,
    laplacian_spectrum,
)
from tokennet.position.learned import LearnedPosition, LearnedPosition2D
from tokennet.position.rope import RotaryEmbedding, apply_rope, rotate_half
from tokennet.position.sinusoidal import SinusoidalPosition, sinusoidal_table
from tokennet.position.spherical import SphericalHarmonicsPosition, real_spherical_harmonics

__all__ = [
    "sinusoidal_table",
    "SinusoidalPosition",
    "LearnedPosition",
    "LearnedPosition2D",
    "fourier_2d",
    "Fourier2DPosition",
    "random_fourier_features",
    "real_spherical_harmonics",
    "SphericalHarmonicsPosition",
    "laplacian_eigenvectors",
    "LaplacianPosition",
    "laplacian_spectrum",
    "CommuteTimePosition",
    "SpectralKernelBias",
    "RotaryEmbedding",
    "apply_rope",
    "rotate_half",
    "alibi_slopes",
    "alibi_bias",
    "ALiBi",
]
