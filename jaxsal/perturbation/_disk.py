"""Greydanus-style local masks and spatial Gaussian blur as small matrices (exact scipy match).

A separable Gaussian filter with scipy's 'reflect' boundary is linear, so along one axis it is
an (L, L) matrix B (built once on host with scipy); blur(img) = B_h @ img @ B_w^T for each frame
separately (never across the stacked frames). The blurred-disk mask of centre (i, j) is then a
sum of outer products of B's columns, built on device for any number of centres.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy.ndimage import gaussian_filter1d

from jaxsal.caching import memo
from jaxsal.errors import SaliencyInputError

MASK_SHAPES = ("gaussian", "hard")
# Greydanus' disk: the pixels with dy^2 + dx^2 <= 1 around the centre.
_PLUS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))


@memo("blur matrices", 64)
def _blur_matrix_np(length: int, sigma: float) -> np.ndarray:
    if sigma == 0:
        return np.eye(length, dtype=np.float32)
    # Column j is the filter's response to a unit impulse at j: filter(v) = B @ v.
    return gaussian_filter1d(np.eye(length), sigma, axis=0, mode="reflect").astype(np.float32)


def blur_matrix(length: int, sigma: float):
    """(L, L) matrix of scipy.ndimage.gaussian_filter1d(., sigma, mode='reflect') on length L."""
    return jnp.asarray(_blur_matrix_np(int(length), float(sigma)))


def blur_frames(x, bh, bw):
    """Spatial Gaussian blur of (..., H, W, C) frames, each frame on its own: B_h x B_w^T."""
    return jnp.einsum("hi,...ijc,wj->...hwc", bh, x, bw)


def centres(length: int, stride: int):
    """Mask centres 0, stride, 2*stride, ... < length along one axis (Greydanus' grid)."""
    return np.arange(0, length, stride, dtype=np.int32)


def disk_mask(ci, cj, hw, *, radius: float, shape: str, bh=None, bw=None):
    """(H, W) mask in [0, 1] centred at (ci, cj) (traced ints).

    shape="gaussian": Greydanus' 5-pixel disk blurred with sigma=radius (reflect boundary),
    divided by its max (needs bh, bw = blur matrices of sigma=radius). shape="hard": the disk
    (i - ci)^2 + (j - cj)^2 <= radius^2.
    """
    h, w = hw
    if shape == "hard":
        ii = jnp.arange(h)[:, None] - ci
        jj = jnp.arange(w)[None, :] - cj
        return ((ii * ii + jj * jj) <= radius * radius).astype(jnp.float32)
    # Every column of B is zero beyond scipy's truncation radius int(4 sigma + .5) (the reflected
    # part folds back inside it), so the mask is zero outside the box of half side `half` around
    # the centre and its max is taken on that box alone; the frame-sized sum stays an
    # elementwise expression XLA fuses into whatever reads it (noise sensitivity's incremental
    # pass reads only a window), never materialised per centre for the max.
    half = gaussian_half(radius)
    box_h, box_w = min(2 * half + 1, h), min(2 * half + 1, w)

    def mask(rows, cols):
        m = jnp.zeros((rows.shape[0], cols.shape[0]), jnp.float32)
        for di, dj in _PLUS:
            i, j = ci + di, cj + dj
            inside = ((i >= 0) & (i < h) & (j >= 0) & (j < w)).astype(jnp.float32)
            col = bh[rows, jnp.clip(i, 0, h - 1)]
            row = bw[cols, jnp.clip(j, 0, w - 1)]
            m = m + inside * col[:, None] * row[None, :]
        return m

    peak = jnp.max(mask(jnp.clip(ci - half, 0, h - box_h) + jnp.arange(box_h),
                        jnp.clip(cj - half, 0, w - box_w) + jnp.arange(box_w)))
    return mask(jnp.arange(h), jnp.arange(w)) / peak


def gaussian_half(radius: float) -> int:
    """Half side of the box outside which a Gaussian disk mask of sigma `radius` is exactly 0:
    scipy's truncation radius int(4 sigma + .5) plus the disk's own 1 pixel."""
    return int(4.0 * radius + 0.5) + 1


def check_mask_shape(shape):
    if shape not in MASK_SHAPES:
        raise SaliencyInputError(f"mask_shape must be one of {list(MASK_SHAPES)}, got {shape!r}")
    return shape
