"""Images projected onto the sphere, and uniformly random rotations of them (Spherical CNNs' data).

As in Cohen et al. 2018 (Spherical CNNs, https://arxiv.org/abs/1801.10130, their "spherical MNIST"):
the image lies on the plane tangent to the sphere at the north pole and is projected onto the northern
hemisphere. Here by stereographic projection from the south pole (conformal: pixels keep their shape and
roughly their size, where the gnomonic projection through the centre blows the central pixels up): a point
``p`` with ``p_z > 0`` sees the image at ``(u, v) = (p_x, p_y) / ((1 + p_z) · extent)``, the image spanning
``u, v ∈ [−1, 1]``; ``extent = tan(Θ/2)`` puts the image's edge midpoints Θ from the pole (the recipe's
0.7: Θ = 70°). The rest of the sphere is 0. Pixels are interpolated bilinearly, so the signal is a
continuous function ``f`` on the sphere.

A rotation ``R`` gives the signal ``f_R(p) = f(Rᵀ p)``, sampled at the same points: the rotated
*continuous* function re-sampled, never a permutation of samples. Rotations are uniform on SO(3)
(normalized Gaussian quaternions, Shoemake 1992), drawn from a seeded generator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import DataError
from .spec import DataSpec, register_data

__all__ = ["random_rotations", "project_images", "equirectangular_points", "SphereImages", "projected_set",
           "rotation_seed", "SphereProjection", "TEST_SEED"]

TEST_SEED = 7919  # the rotations of the rotated test set: fixed, so every run and `tokennet eval` agree


def rotation_seed(*parts: int) -> int:
    """One generator seed from integers (a split, a seed, a batch index), stable across processes."""
    combined = 0
    for part in parts:
        combined = (combined * 1_000_003 + int(part)) % (2**62)
    return combined


def random_rotations(n: int, seed: int) -> Tensor:
    """``n`` rotation matrices ``(n, 3, 3)``, uniform on SO(3), from the generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    real, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * real), 2 * (x * z + y * real),
        2 * (x * y + z * real), 1 - 2 * (x * x + z * z), 2 * (y * z - x * real),
        2 * (x * z - y * real), 2 * (y * z + x * real), 1 - 2 * (x * x + y * y),
    ], dim=-1).view(n, 3, 3)


def project_images(images: Tensor, points: Tensor, rotations: Tensor | None = None, extent: float = 1.0) -> Tensor:
    """Sample the projected images (rotated by ``rotations``) at unit vectors ``points``.

    Args:
        images: ``(B, C, H, W)``.
        points: ``(P, 3)`` unit vectors.
        rotations: ``(B, 3, 3)`` or None (unrotated): the signal is ``f(Rᵀ p)``.
        extent: the image's half-width on the stereographic plane, ``tan(Θ/2)`` for an edge Θ from the pole.

    Returns:
        ``(B, C, P)`` float32.
    """
    B = images.shape[0]
    pts = points.double().expand(B, -1, -1)  # (B, P, 3)
    if rotations is not None:
        pts = pts @ rotations.double()  # row pᵀ R = (Rᵀ p)ᵀ
    z = pts[..., 2]
    front = z > 1e-6
    plane_scale = (1.0 + z) * extent  # stereographic from the south pole
    # grid_sample's x indexes columns (W), y rows (H); image row 0 is at v = −1.
    # (B, P, 1, 2)
    grid = torch.stack([pts[..., 0] / plane_scale, pts[..., 1] / plane_scale], dim=-1).float()[:, :, None]
    grid = torch.where(front[:, :, None, None], grid, torch.full_like(grid, 4.0))  # far outside: zeros padding
    out = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[..., 0]  # (B, C, P)


def equirectangular_points(height: int, width: int) -> Tensor:
    """The lat/lon grid's pixel centres as unit vectors ``(height·width, 3)``, row-major, north at row 0."""
    theta = (torch.arange(height, dtype=torch.float64) + 0.5) * math.pi / height
    phi = (torch.arange(width, dtype=torch.float64) + 0.5) * 2 * math.pi / width - math.pi
    theta_grid, phi_grid = torch.meshgrid(theta, phi, indexing="ij")
    return torch.stack([theta_grid.sin() * phi_grid.cos(), theta_grid.sin() * phi_grid.sin(), theta_grid.cos()],
                       dim=-1).view(-1, 3)


def projected_set(images: Tensor, points: Tensor, *, rotate: bool, seed: int, extent: float = 1.0,
                  chunk: int = 512) -> Tensor:
    """Project a whole set ``(B, C, H, W) → (B, C, P)``, each image rotated (seeded per chunk) or not."""
    out = []
    for k, i in enumerate(range(0, len(images), chunk)):
        x = images[i:i + chunk]
        rot = random_rotations(len(x), rotation_seed(seed, k)) if rotate else None
        out.append(project_images(x, points, rot, extent))
    return torch.cat(out) if out else torch.zeros(0, images.shape[1], len(points))


class SphereImages:
    """Batch source for the trainer: ``batch(i)`` projects ``batch_size`` images drawn with ``(seed, i)``,
    each freshly rotated when ``rotate`` (a new uniform rotation per image per step).

    Args:
        images, labels: ``(N, C, H, W)`` and ``(N,)``.
        points: ``(P, 3)`` where the model samples the sphere.
        batch_size, seed, rotate, extent: as named.
        shape: the model's input shape after the batch dimension (default ``(C, P)``; ``(C, h, w)`` for a
            planar model on an equirectangular grid).
    """

    def __init__(self, images: Tensor, labels: Tensor, points: Tensor, batch_size: int, *, seed: int = 0,
                 rotate: bool = False, extent: float = 1.0, shape: tuple[int, ...] | None = None):
        self.images, self.labels, self.points = images, labels, points
        self.batch_size, self.seed, self.rotate, self.extent = batch_size, seed, rotate, extent
        self.shape = shape

    def batch(self, index: int) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(rotation_seed(self.seed, index))
        idx = torch.randint(len(self.labels), (self.batch_size,), generator=generator)
        rot = random_rotations(self.batch_size, rotation_seed(self.seed, index, 1)) if self.rotate else None
        x = project_images(self.images[idx], self.points, rot, self.extent)  # (B, C, P)
        if self.shape is not None:
            x = x.reshape(self.batch_size, *self.shape)
        return x, self.labels[idx]


@register_data
@dataclasses.dataclass
class SphereProjection(DataSpec):
    """Images (``source``: digits or Fashion-MNIST, as for ``vit``) projected onto the northern hemisphere with
    ``extent`` (see the module docstring), trained unrotated or under fresh rotations (``train_rotated``). The
    last ``val_size`` training images validate; the test set is the first ``test_size`` test images (0: all),
    unrotated and under the fixed rotations of :data:`TEST_SEED`.

    Args:
        source: the images: ``digits`` or ``fashion-mnist``, as for ``vit`` (``--data``).
        val_size: the last training images, held out for validation.
        test_size: test images used (0: all).
        extent: how much of the hemisphere the image covers (the projection's scale, see the module docstring).
        train_rotated: train under fresh random rotations of the sphere (default: unrotated).
    """

    kind: ClassVar[str] = "sphere-images"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("sphere",)
    source: str = "digits"
    val_size: int = 100
    test_size: int = 0
    extent: float = 0.7
    train_rotated: bool = False

    def __post_init__(self):
        if not self.extent > 0:
            raise DataError(f"extent must be positive, got {self.extent}")
        if self.test_size < 0:
            raise DataError("test_size must be >= 0 (0: the whole test split)")

    @classmethod
    def from_legacy(cls, data, settings) -> SphereProjection:
        return cls(source=data if data not in (None, "") else "digits", val_size=settings.get("val_size", 100),
                   test_size=settings.get("test_size", 0), extent=settings.get("extent", 0.7),
                   train_rotated=settings.get("train_rotated", False))

    def images(self):
        """The flat images (:class:`~tokennet.data.vision_data.VisionData`); 1-D signals are refused."""
        from .vision_data import dataset_kind, load_dataset

        if dataset_kind(self.source) == "mnist1d":
            raise DataError("the sphere recipe projects images: use digits (default), fashion-mnist or a directory "
                            "of Fashion-MNIST idx files")
        return load_dataset(self.source)

    def split(self):
        """``((x, y) train, (x, y) validation, (x, y) test)`` of the flat images."""
        data = self.images()
        n_val = self.val_size
        if not 1 <= n_val < len(data.y_train):
            raise DataError(f"val_size must be in 1..{len(data.y_train) - 1}, got {n_val}")
        test_n = self.test_size if self.test_size > 0 else len(data.y_test)
        return ((data.x_train[:-n_val], data.y_train[:-n_val]), (data.x_train[-n_val:], data.y_train[-n_val:]),
                (data.x_test[:test_n], data.y_test[:test_n]))

    def project(self, images: Tensor, points: Tensor, *, rotate: bool = False, seed: int = TEST_SEED) -> Tensor:
        """Images ``(B, C, H, W)`` as signals ``(B, C, P)`` at ``points``, as this data projects them."""
        return projected_set(images, points, rotate=rotate, seed=seed, extent=self.extent)

    def held_out(self, points: Tensor, shape: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(unrotated signals, rotated signals, labels)`` of the test images at ``points``."""
        _, _, (x, y) = self.split()
        unrotated, rotated = self.project(x, points), self.project(x, points, rotate=True)
        if shape is not None:
            unrotated, rotated = unrotated.reshape(len(unrotated), *shape), rotated.reshape(len(rotated), *shape)
        return unrotated, rotated, y
