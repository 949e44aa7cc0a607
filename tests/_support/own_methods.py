"""Methods defined outside jaxsal, as a user's module would: a gradient method and a
perturbation method written to the method protocol (jaxsal.engine.Spec), SmoothGrad of the
gradient method (a stochastic one), and a CAM variant by its channel weights. Importing the module registers them (a plugin: `JAXSAL_METHODS=this_file.py
jaxsal explain --methods abs_gradient ...`); tests/test_own_methods.py imports and unregisters it.
"""
import jax
import jax.numpy as jnp
import numpy as np

import jaxsal
from jaxsal.backprop.cam import CamSpec
from jaxsal.engine import Prepared, Spec, objective
from jaxsal.errors import SaliencyInputError

NAMES = ("abs_gradient", "smooth_abs_gradient", "patch_drop", "max_gradcam")


def _nhwc(a, layout):
    return a if layout == "NHWC" else jnp.transpose(a, (0, 2, 3, 1))


# ---- a gradient method: |dy/dx|, summed over channels (or per channel)
def _grad_prepare(call, apply_fn, params, *, per_frame=False):
    return Prepared(static=bool(per_frame))


def _grad_chunk(ctx, params, prep, rows, group, shared):
    return jax.grad(lambda x: objective(ctx.target, ctx.apply_fn(params, x), rows.actions).sum())(rows.x)


def _grad_finalize(ctx, params, prep, rows, acc):
    a = jnp.abs(_nhwc(acc, ctx.layout))
    return a if prep.static else a.sum(-1)


abs_gradient = jaxsal.register(Spec(
    "abs_gradient", _grad_prepare, _grad_chunk, _grad_finalize, options={"per_frame": False},
    kind="gradient", doc="The magnitude of the input gradient, |dy/dx|."))
smooth_abs_gradient = jaxsal.register(jaxsal.noise_tunnel(abs_gradient.jaxsal_spec, n=8), name="smooth_abs_gradient")
"""A stochastic method: SmoothGrad of it (noise keyed by key= and each state's position)."""


# ---- a perturbation method: each patch's drop of the target when the patch is set to 0
def _patch_prepare(call, apply_fn, params, *, patch=4):
    h, w, _ = call.hwc
    if not isinstance(patch, int) or patch < 1 or h % patch or w % patch:
        raise SaliencyInputError(f"patch must be a positive int dividing the frame size {h}x{w}, got {patch!r}")
    corners = tuple(np.array([i, j], np.int32) for i in range(0, h, patch) for j in range(0, w, patch))
    return Prepared(static=(patch, h, w), groups=corners)  # the inner loop: one group per patch


def _patch_mask(corner, patch, h, w):
    ii, jj = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
    return ((ii >= corner[0]) & (ii < corner[0] + patch) & (jj >= corner[1]) & (jj < corner[1] + patch)
            ).astype(jnp.float32)


def _patch_chunk(ctx, params, prep, rows, corner, shared):
    m = _patch_mask(corner, *prep.static)
    keep = 1.0 - (m[None, :, :, None] if ctx.layout == "NHWC" else m[None, None])
    y = objective(ctx.target, ctx.apply_fn(params, rows.x * keep), rows.actions)
    return -y[:, None, None] * m  # summed over the patches, which tile the frame


def _patch_finalize(ctx, params, prep, rows, acc):
    y0 = objective(ctx.target, ctx.apply_fn(params, rows.x), rows.actions)
    return y0[:, None, None] + acc  # each pixel: y(x) - y(x with its patch removed)


patch_drop = jaxsal.register(Spec(
    "patch_drop", _patch_prepare, _patch_chunk, _patch_finalize, options={"patch": 4}, example={"patch": 4},
    doc="Drop of the target when each patch of a grid is set to 0."))


# ---- a CAM variant: each channel weighted by its largest gradient
def max_weights(A, g):
    """w_k = max_ij dY/dA^k_ij."""
    del A
    return g.max(axis=(1, 2))


max_gradcam = jaxsal.register(CamSpec(max_weights), name="max_gradcam")
