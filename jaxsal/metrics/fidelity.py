"""Insertion and deletion fidelity (Paper B / Petsiuk 2018): how fast the agent's score
recovers (insertion) or collapses (deletion) when pixels are moved in order of saliency.

All steps of all states run as one batched forward pass per chunk of states on device:
for a chunk of B states the model sees B x (steps + 1) perturbed frame stacks at once.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import targets as T
from jaxsal.batching import cached_jit, default_rows, map_batched
from jaxsal.errors import SaliencyInputError
from jaxsal.metrics.similarity import check_maps
from jaxsal.checks import check_obs, check_positive_int, spatial_shape

SUBSTRATES = ("black", "random", "blur")
SCORES = ("q_value", "advantage")


def gaussian_blur(x, sigma: float, truncate: float = 4.0):
    """Spatial Gaussian blur of NHWC frames, each frame separately (scipy.ndimage.gaussian_filter
    with sigma (0, s, s, 0), mode 'reflect', truncate 4): never blurs across stacked frames."""
    radius = int(truncate * float(sigma) + 0.5)
    if radius == 0:
        return x
    t = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
    k = jnp.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    xp = jnp.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode="symmetric")
    h, w = x.shape[1], x.shape[2]
    rows = sum(k[i] * xp[:, i:i + h, :, :] for i in range(2 * radius + 1))
    return sum(k[i] * rows[:, :, i:i + w, :] for i in range(2 * radius + 1))


def _order_masks(m, steps: int, per_step: int):
    """(steps + 1, H, W) bool: True where a pixel is among the top t * per_step by saliency.

    Pixels are ranked by decreasing saliency; ties keep raster order (stable sort)."""
    flat = m.ravel()
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros(flat.shape[0], jnp.int32).at[order].set(jnp.arange(flat.shape[0], dtype=jnp.int32))
    counts = jnp.minimum(jnp.arange(steps + 1) * per_step, flat.shape[0])
    return (rank[None, :] < counts[:, None]).reshape((steps + 1,) + m.shape)


def chosen_actions(apply_fn, params, obs, batch_size: int | None = 256):
    """argmax Q(obs) per state (the action every perturbed copy is scored on), chunked."""
    fn = cached_jit(_argmax_q, apply_fn)
    return map_batched(fn, params, obs, batch_size=batch_size)


def _argmax_q(apply_fn):
    return lambda p, o: jnp.argmax(T.q_of(apply_fn(p, o)), -1).astype(jnp.int32)


def _build_substrate(substrate: str, layout: str, pixel_range: tuple, blur_sigma: float):
    lo, hi = pixel_range

    def fn(_, obs, keys):
        x = obs if layout == "NHWC" else jnp.transpose(obs, (0, 2, 3, 1))     # NHWC
        if substrate == "black":
            return jnp.zeros_like(x)
        if substrate == "random":
            return jax.vmap(lambda k: jax.random.uniform(k, x.shape[1:], jnp.float32, lo, hi))(keys)
        return gaussian_blur(x, blur_sigma)
    return fn


def _build(apply_fn, steps: int, per_step: int, layout: str):
    """One compiled function for every mode, substrate and score (they differ only in data):
    x_t = where(top-t mask, first, second); returns both scores, (B, steps + 1) each."""

    def fn(params, obs, first, second, maps, actions):
        b = obs.shape[0]
        masks = jax.vmap(lambda m: _order_masks(m, steps, per_step))(maps)[..., None]  # (B,S+1,H,W,1)
        xt = jnp.where(masks, first[:, None], second[:, None])
        xt = xt.reshape((b * (steps + 1),) + first.shape[1:])
        if layout == "NCHW":
            xt = jnp.transpose(xt, (0, 3, 1, 2))
        q = T.q_of(apply_fn(params, xt))
        q = q.reshape((b, steps + 1) + q.shape[1:])
        qa = jnp.take_along_axis(q, actions[:, None, None], axis=-1)[..., 0]  # (B, S+1)
        q0 = jnp.take_along_axis(T.q_of(apply_fn(params, obs)), actions[:, None], axis=-1)
        return {"q_value": qa / q0, "advantage": qa - q.mean(-1)}
    return fn


def _curves(mode, apply_fn, params, obs, maps, substrate, pixels_per_step, score, key, actions,
            batch_size, layout, pixel_range, blur_sigma):
    if substrate not in SUBSTRATES:
        raise SaliencyInputError(f"substrate must be one of {SUBSTRATES}, got {substrate!r}")
    if score not in SCORES + ("all",):
        raise SaliencyInputError(f"score must be one of {SCORES} or 'all', got {score!r}")
    x = check_obs(obs, layout)
    h, w, _ = spatial_shape(x.shape, layout)
    n = x.shape[0]
    m = check_maps(maps, "maps", shape=(n, h, w))
    per_step = check_positive_int("pixels_per_step", pixels_per_step)
    steps = math.ceil(h * w / per_step)
    batch_size = default_rows() if batch_size is None else batch_size
    if substrate == "random" and key is None:
        raise SaliencyInputError("substrate='random' needs key=jax.random.PRNGKey(seed) "
                                 "(same key -> same substrate)")
    if substrate == "blur" and not (isinstance(blur_sigma, (int, float)) and blur_sigma > 0):
        raise SaliencyInputError(f"blur_sigma must be a positive number, got {blur_sigma!r}")
    try:
        lo, hi = (float(v) for v in pixel_range)
    except (TypeError, ValueError):
        raise SaliencyInputError(f"pixel_range must be (low, high), got {pixel_range!r}") from None
    if actions is None:
        actions = chosen_actions(apply_fn, params, x)
    else:
        q_shape = jax.eval_shape(lambda p, o: T.q_of(apply_fn(p, o)), params, x[:1]).shape
        actions = jnp.asarray(T.check_actions(actions, n, q_shape[-1]))
    base = jax.random.PRNGKey(0) if key is None else key
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n))
    sub_fn = cached_jit(_build_substrate, substrate, layout, (lo, hi), float(blur_sigma))
    sub = map_batched(sub_fn, None, x, keys, batch_size=batch_size)
    xs = x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))
    first, second = (xs, sub) if mode == "insertion" else (sub, xs)
    fn = cached_jit(_build, apply_fn, steps, per_step, layout)
    curves = map_batched(fn, params, x, first, second, m, actions, batch_size=batch_size,
                         rows_per_state=steps + 1)
    if score == "all":
        return {k: {"auc": c.mean(-1), "curves": c} for k, c in curves.items()}
    return {"auc": curves[score].mean(-1), "curves": curves[score]}


def insertion(apply_fn, params, obs, maps, substrate: str = "black", pixels_per_step: int = 84,
              score: str = "q_value", key=None, *, actions=None, batch_size: int | None = None,
              layout: str = "NHWC", pixel_range=(0.0, 255.0), blur_sigma: float = 5.0):
    """Insertion curves: start from `substrate`, insert pixels (all frames of a pixel at once)
    by decreasing saliency, `pixels_per_step` per step; returns {"auc": (N,), "curves": (N, S+1)}.

    substrate: "black" (0), "random" (uniform in `pixel_range` per pixel and frame; needs `key`)
    or "blur" (spatial Gaussian blur, `blur_sigma` px). score: "q_value" = Q_a(x_t) / Q_a(x) or
    "advantage" = Q_a(x_t) - mean_b Q_b(x_t), a = argmax Q(x) unless `actions` is given.
    score="all" returns {"q_value": {...}, "advantage": {...}} from the same forward passes.
    AUC is the mean of the curve (Paper B). `batch_size` bounds the model rows (states x
    (steps + 1)) per forward pass (None: the backend's default). Higher insertion AUC = more faithful map.
    """
    return _curves("insertion", apply_fn, params, obs, maps, substrate, pixels_per_step, score,
                   key, actions, batch_size, layout, pixel_range, blur_sigma)


def deletion(apply_fn, params, obs, maps, substrate: str = "black", pixels_per_step: int = 84,
             score: str = "q_value", key=None, *, actions=None, batch_size: int | None = None,
             layout: str = "NHWC", pixel_range=(0.0, 255.0), blur_sigma: float = 5.0):
    """Deletion curves, the mirror of `insertion`: start from the observation and replace pixels
    by the substrate in order of decreasing saliency. Lower deletion AUC = more faithful map."""
    return _curves("deletion", apply_fn, params, obs, maps, substrate, pixels_per_step, score,
                   key, actions, batch_size, layout, pixel_range, blur_sigma)
