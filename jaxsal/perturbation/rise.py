"""RISE (Petsiuk et al. 2018): random smooth masks, map = score-weighted mean of the masks."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.batching import is_traced
from jaxsal.caching import memo
from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation import _common as C
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
    """RISE's random smooth masks, drawn from `key` (same key, same masks): pass them to `rise` as
    `masks=` to explain several models with the same masks.

    Each mask is a binary `grid` x `grid` draw (1 with probability `p_keep`), bilinearly
    upsampled to (grid + 1) * ceil(H / grid) px (99 for 84 and grid 8; scikit-image's resize,
    reflect mode), randomly shifted by 0 .. cell - 1 px per axis and cropped to (H, W), as in
    Petsiuk's code.

    Args:
        key (jax.Array): PRNG key, e.g. `jax.random.PRNGKey(0)`.
        n_masks (int): how many masks.
        shape (tuple[int, int]): (H, W) of the masks, the observations' spatial size.
        grid (int | tuple[int, int]): cells per axis of the binary draw, or (gy, gx).
        p_keep (float): probability that a cell is kept (1), in (0, 1].

    Returns:
        jax.Array: the masks, shape (n_masks, H, W) float32, values in [0, 1].

    Raises:
        jaxsal.SaliencyInputError: a missing or invalid `key`; `n_masks` not a positive int;
            `shape` not (H, W); a `grid` with more cells than pixels; `p_keep` outside (0, 1].
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
    # host (numpy) matrices: a jax array made here while the caller's jit traces would be a
    # tracer kept in the memo, leaking into every later (eager) call
    uy, ux = _upsample_matrix(g[0], up[0]), _upsample_matrix(g[1], up[1])

    def one(bits, sy, sx):
        big = jnp.matmul(jnp.matmul(uy, bits, precision="highest"), ux.T, precision="highest")
        return jax.lax.dynamic_slice(big, (sy, sx), hw)

    @functools.partial(jax.jit, static_argnums=1)
    def build(key, n, p):
        return jax.vmap(one)(*rise_bits(key, n, g, cell, p))

    return build


# the method's signature and docstring; the function registered below runs SPEC on the engine
def rise(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
         batch_size=None, precision="float32", n_masks: int = 1000, grid=8, p_keep: float = 0.5, masks=None, fill=0.0,
         obs_max=None):
    """RISE maps (Petsiuk et al. 2018): the mean of random smooth masks weighted by the target's
    score on the input seen through each mask.

    S = sum_i t(x_i') M_i / (n_masks p_keep), with x_i' = x M_i + fill (1 - M_i) on every stacked
    frame. Defaults are Paper B's: 1000 masks on an 8x8 grid, p_keep 0.5, black fill, the raw
    target t (Q_a). The masks are drawn once from `key` and shared by every state.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output` (Q-values (N, A), or a
            dict/tuple with them or policy logits).
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) in layout "NCHW".
        target (str | Callable): what is explained (`jaxsal.targets`: a name or a callable
            `output -> (N,)`).
        actions (jax.Array | None): (N,) actions to explain (needed by "q_action"); None: the
            target's choice on the clean input, fixed once.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        key (jax.Array | None): PRNG key the masks are drawn from (`rise_masks`); required
            unless `masks` is given.
        batch_size (int | None): model rows (states x masks) per forward pass; None: the
            backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        n_masks (int): how many masks.
        grid (int | tuple[int, int]): cells per axis of each mask's binary draw.
        p_keep (float): probability that a cell is kept, in (0, 1]; also the normalisation.
        masks (jax.Array | None): masks (n, H, W) to use instead of drawing them (e.g. the same
            masks across models; `key` is then unused, `p_keep` still normalises).
        fill (float | str): what masked-out pixels become: a fraction of the value range (0
            black, 0.5 grey = 127.5 for 0..255 frames; see `obs_max`), or "black", "grey",
            "white" or "mean" (each state's mean per stacked frame).
        obs_max (float | None): the top of the observations' value range, which `fill`
            fractions scale; None: 255 for integer frames, for float frames 1.0 when every
            value is <= 1, else 255.

    Returns:
        jax.Array: the maps, shape (N, H, W) float32.

    Raises:
        jaxsal.SaliencyInputError: no `key` and no `masks`; `masks` not (n, H, W) or not finite;
            `p_keep` outside (0, 1]; a bad `n_masks`, `grid`, `fill` or `obs_max`; or a bad call
            (obs, target, actions, layout, batch_size), as `jaxsal.explain` reports it.
    """


def _prepare(call, apply_fn, params, *, key, n_masks, grid, p_keep, masks, fill, obs_max):
    h, w, _ = call.hwc
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
        if not is_traced(masks) and not bool(jnp.isfinite(masks).all()):
            raise SaliencyInputError("masks contain NaN or inf values")
    m = masks.shape[0]
    kind, value = C.fill_value(fill, call.x, obs_max)
    norm = float(m * p_keep)

    def perturb(consts, st, idx):
        mk = consts["masks"][idx][:, :, None]
        return st["x"] * mk + C.fill_of(kind, consts["fill"], st["x"]) * (1.0 - mk)

    def finish(consts, x, extra, scores):
        """sum_i score_i * mask_i / norm: (S, n_masks) -> (S, H, W)."""
        sal = jnp.matmul(scores, consts["masks"].reshape(m, h * w), precision=jax.lax.Precision.HIGHEST) / norm
        return sal.reshape(scores.shape[0], h, w)

    return C.prepared(call, perturb=perturb, score=C.make_score("target", call.target), finish=finish,
                      n_pert=m, consts={"masks": masks, "fill": value}, model=(apply_fn, params))


SPEC = C.perturbation_spec("rise", _prepare, C.options_of(rise), stochastic=True,
                           example={"n_masks": 16, "grid": 4})
rise = C.register(SPEC, rise)
