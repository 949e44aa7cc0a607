"""RISE (Petsiuk et al. 2018): random smooth masks, map = score-weighted mean of the masks."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.batching import memo, per_state
from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation import _common as C
from jaxsal.registry import register
from jaxsal.checks import check_key, check_positive_int


@memo("RISE upsampling matrices", 32)
def _upsample_matrix(grid: int, up: int) -> np.ndarray:
    """(up, grid) matrix of skimage.transform.resize(order=1, mode='reflect', anti_aliasing=False)
    from `grid` to `up` samples along one axis (bilinear resize is separable: U G U^T)."""
    from skimage.transform import resize

    eye = np.eye(grid)
    cols = [resize(eye[:, k:k + 1], (up, 1), order=1, mode="reflect", anti_aliasing=False,
                   preserve_range=True)[:, 0] for k in range(grid)]
    return np.stack(cols, axis=1).astype(np.float32)


def rise_mask_geometry(hw, grid):
    """(cell, up) per axis: cell = ceil(L / grid), up = (grid + 1) * cell (Petsiuk's code)."""
    cell = tuple(int(math.ceil(L / g)) for L, g in zip(hw, grid))
    up = tuple((g + 1) * c for g, c in zip(grid, cell))
    return cell, up


def _grid2(grid):
    if isinstance(grid, (tuple, list)):
        if len(grid) != 2:
            raise SaliencyInputError(f"grid must be an int or a (gy, gx) pair, got {grid!r}")
        return tuple(check_positive_int("grid", g) for g in grid)
    g = check_positive_int("grid", grid)
    return g, g


def rise_masks(key, n_masks: int = 1000, shape=(84, 84), grid=8, p_keep: float = 0.5):
    """(n_masks, H, W) float32 RISE masks from `key` (same key -> same masks).

    Each mask: a binary `grid`x`grid` draw (1 with probability p_keep), bilinearly upsampled
    to (grid + 1) * ceil(H / grid) px (99 for 84 and grid 8; skimage's resize, reflect mode),
    randomly shifted by 0..cell-1 px per axis and cropped to (H, W), as in Petsiuk's code.
    """
    check_key(key, "rise")
    n_masks = check_positive_int("n_masks", n_masks)
    if len(tuple(shape)) != 2:
        raise SaliencyInputError(f"shape must be (H, W), got {shape!r}")
    h, w = (check_positive_int("shape", int(s)) for s in shape)
    g = _grid2(grid)
    if g[0] > h or g[1] > w:
        raise SaliencyInputError(f"grid={grid} does not fit the {h}x{w} image: at most one cell per pixel")
    p_keep = C.check_positive_float("p_keep", p_keep)
    if p_keep > 1:
        raise SaliencyInputError(f"p_keep must be in (0, 1], got {p_keep}")
    cell, up = rise_mask_geometry((h, w), g)
    fn = _mask_builder(g, cell, up, (h, w))
    return fn(key, n_masks, jnp.float32(p_keep))


def rise_bits(key, n_masks: int, grid, cell, p_keep):
    """The random draws behind `rise_masks`: binary grids (n, gy, gx) and shifts (n,), (n,)."""
    kg, ky, kx = jax.random.split(key, 3)
    bits = jax.random.bernoulli(kg, p_keep, (n_masks,) + tuple(grid)).astype(jnp.float32)
    sy = jax.random.randint(ky, (n_masks,), 0, cell[0])
    sx = jax.random.randint(kx, (n_masks,), 0, cell[1])
    return bits, sy, sx


@memo("RISE mask builders", 32)
def _mask_builder(g, cell, up, hw):
    uy = jnp.asarray(_upsample_matrix(g[0], up[0]))
    ux = jnp.asarray(_upsample_matrix(g[1], up[1]))

    def one(bits, sy, sx):
        big = jnp.matmul(jnp.matmul(uy, bits, precision="highest"), ux.T, precision="highest")
        return jax.lax.dynamic_slice(big, (sy, sx), hw)

    @functools.partial(jax.jit, static_argnums=1)
    def build(key, n, p):
        return jax.vmap(one)(*rise_bits(key, n, g, cell, p))

    return build


@register("rise", stochastic=True)
def rise(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
         batch_size=None, n_masks: int = 1000, grid=8, p_keep: float = 0.5, masks=None, fill=0.0,
         obs_max=None):
    """RISE maps (N, H, W): S = sum_i t(x_i') M_i / (n_masks p_keep), x_i' = x M_i + fill (1 - M_i).

    Paper B's parameters (defaults): 1000 masks on an 8x8 grid, p_keep 0.5, black fill, raw
    target t (Q_a). The masks are drawn once from `key` (see `rise_masks`) and reused for every
    state; pass `masks` (n, H, W) instead to reuse the same masks across models (key then unused;
    p_keep still normalises). batch_size bounds model rows (states x masks) per forward pass.
    """
    prep = C.clean_pass(apply_fn, params, obs, layout=layout, target=target, actions=actions,
                        batch_size=batch_size, obs_max=obs_max)
    n, h, w, _ = prep.shape
    p_keep = C.check_positive_float("p_keep", p_keep)
    if p_keep > 1:
        raise SaliencyInputError(f"p_keep must be in (0, 1], got {p_keep}")
    if masks is None:
        check_key(key, "rise")
        masks = rise_masks(key, n_masks, (h, w), grid, p_keep)
    else:
        mshape = tuple(np.shape(masks))
        if len(mshape) != 3 or mshape[1:] != (h, w):
            raise SaliencyInputError(f"masks must have shape (n_masks, {h}, {w}), got {mshape}")
        masks = jnp.asarray(masks, jnp.float32)
        if not C.is_traced(masks) and not bool(jnp.isfinite(masks).all()):
            raise SaliencyInputError("masks contain NaN or inf values")
    m = masks.shape[0]
    fillv = C.resolve_fill(fill, prep.x, prep.obs_max)

    def perturb(consts, st, idx):
        mk = consts["masks"][idx][:, :, None]
        return st["x"] * mk + st["fill"] * (1.0 - mk)

    scores = C.perturbation_scores(
        prep, apply_fn, params, perturb=perturb,
        score=C.make_score("target", prep.target), n_pert=m, consts={"masks": masks},
        states={"fill": fillv})
    return per_state(_saliency, (float(m * p_keep),), masks, scores)


def _saliency(norm):
    """(S, n_masks) scores, masks (n_masks, H, W) -> (S, H, W): sum_i score_i * mask_i / norm."""
    def f(masks, scores):
        m, h, w = masks.shape
        sal = jnp.matmul(scores, masks.reshape(m, h * w), precision=jax.lax.Precision.HIGHEST) / norm
        return sal.reshape(scores.shape[0], h, w)
    return f
