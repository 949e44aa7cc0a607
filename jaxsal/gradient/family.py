"""One engine for every single-backward method: plain, guided and deconvnet gradients at the
input and at a tapped layer, computed together in one jitted function per chunk.

Asking for several methods at once (e.g. gradcam + gradcam_pp + guided_backprop + g2gradcam)
shares the work: one plain and/or one guided backward gives all the maps; XLA shares the
forward pass between them.

Time-distributed trunks (a shared CNN run on the T frames of each state, so the tapped layer
outputs (N*T, h, w, K)) get one CAM per (state, frame): see jaxsal.gradient.cam.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal import batching
from jaxsal.errors import SaliencyInputError
from jaxsal.gradient import cam
from jaxsal.gradient.common import (as_float, finish, objective, params_signature, prepare,
                                    run_chunks)
from jaxsal.gradient.layers import get_activation, resolve_tap, tap
from jaxsal.gradient.rules import rewrite
from jaxsal.validate import to_nhwc

FAMILY = ("gradient", "grad_x_input", "guided_backprop", "deconvnet", "gradcam", "gradcam_pp",
          "g1gradcam", "g2gradcam", "guided_gradcam")
LAYER_METHODS = ("gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam")
PER_FRAME_METHODS = ("gradient", "grad_x_input", "guided_backprop", "deconvnet", "g2gradcam",
                     "guided_gradcam")
# (rule, where) gradients each method needs; where is "x" (input) or "layer".
_NEEDS = {
    "gradient": {("plain", "x")}, "grad_x_input": {("plain", "x")},
    "guided_backprop": {("guided", "x")}, "deconvnet": {("deconvnet", "x")},
    "gradcam": {("plain", "layer")}, "gradcam_pp": {("plain", "layer")},
    "g1gradcam": {("guided", "layer")},
    "g2gradcam": {("guided", "layer"), ("guided", "x")},
    "guided_gradcam": {("plain", "layer"), ("guided", "x")},
}


def _build(apply_fn, tgt, methods, layer, activation, layout, per_frame, hw, k=1,
           fast_conv=True):
    """The jitted per-chunk function; k = rows of the tapped layer per state (1: ordinary)."""
    needs = set().union(*(_NEEDS[m] for m in methods))
    rules = sorted({r for r, _ in needs})
    tapped = tap(apply_fn, layer, activation) if layer is not None else None

    def fn(params, x, actions=None):
        x = as_float(x)
        if actions is None:
            actions = tgt.choose(apply_fn(params, x)).astype(jnp.int32)
        res = {}
        if tapped is not None:
            a_shape = jax.eval_shape(lambda p, xx: tapped(p, xx, 0.0)[1], params, x)
            eps0 = jnp.zeros(a_shape.shape, a_shape.dtype)
        for rule in rules:
            want_x = (rule, "x") in needs
            want_layer = (rule, "layer") in needs
            if want_layer:
                def f(eps, xx, p):
                    y, A = tapped(p, xx, eps)
                    return objective(tgt, y, actions).sum(), A
                argnums = (0, 1) if want_x else (0,)
                grads, A = jax.grad(rewrite(f, rule, fast_conv), argnums, has_aux=True)(eps0, x, params)
                res["A"] = A
                res[(rule, "layer")] = grads[0]
                if want_x:
                    res[(rule, "x")] = grads[1]
            else:
                def f(xx, p):
                    return objective(tgt, apply_fn(p, xx), actions).sum()
                res[(rule, "x")] = jax.grad(rewrite(f, rule, fast_conv))(x, params)
        out = {}
        for m in methods:
            if m == "gradient":
                out[m] = finish(res[("plain", "x")], layout, per_frame)
            elif m == "grad_x_input":
                out[m] = finish(x * res[("plain", "x")], layout, per_frame)
            elif m in ("guided_backprop", "deconvnet"):
                out[m] = finish(res[("guided" if m == "guided_backprop" else "deconvnet", "x")],
                                layout, per_frame)
            elif k > 1:
                out[m] = _frame_cam(m, res, hw, k, layout, per_frame)
            elif m == "gradcam":
                g = res[("plain", "layer")]
                out[m] = cam.upsample(cam.cam_map(res["A"], cam.gradcam_weights(res["A"], g)), hw)
            elif m == "gradcam_pp":
                g = res[("plain", "layer")]
                out[m] = cam.upsample(cam.cam_map(res["A"], cam.gradcam_pp_weights(res["A"], g)), hw)
            elif m in ("g1gradcam", "g2gradcam", "guided_gradcam"):
                rule = "plain" if m == "guided_gradcam" else "guided"
                g = res[(rule, "layer")]
                c = cam.upsample(cam.cam_map(res["A"], cam.gradcam_weights(res["A"], g)), hw)
                if m == "g1gradcam":
                    out[m] = cam.normalise_max(c)
                    continue
                if m == "g2gradcam":
                    c = cam.normalise_max(c)
                gb = jax.nn.relu(to_nhwc(res[("guided", "x")], layout))
                prod = jax.nn.relu(c)[..., None] * gb
                out[m] = prod if per_frame else prod.sum(-1)
        return out

    return fn


def _frame_cam(m, res, hw, k, layout, per_frame):
    """CAM method m on a time-distributed layer (N*k rows): per-frame maps (N, H, W, k), or
    the frame sum (N, H, W); g2gradcam/guided_gradcam as (N, H, W, C) / summed over C."""
    rule = "guided" if m in ("g1gradcam", "g2gradcam") else "plain"
    weights = cam.gradcam_pp_weights if m == "gradcam_pp" else cam.gradcam_weights
    A, g = res["A"], res[(rule, "layer")]
    c = cam.to_frames(cam.upsample(cam.cam_map(A, weights(A, g)), hw), k)
    if m in ("gradcam", "gradcam_pp"):
        return c if per_frame else c.sum(-1)
    if m == "g1gradcam":
        return cam.normalise_max(c if per_frame else c.sum(-1))
    if m == "g2gradcam":
        c = cam.normalise_max(c)
    gb = jax.nn.relu(to_nhwc(res[("guided", "x")], layout))
    prod = jax.nn.relu(jnp.repeat(c, gb.shape[-1] // k, axis=-1)) * gb
    return prod if per_frame else prod.sum(-1)


def compute(methods, apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC",
            batch_size=None, layer=None, per_frame=False, layer_activation=None,
            fast_conv=True):
    """Maps of several single-backward methods at once: dict name -> (N, H, W[, C]).

    fast_conv (default True): strided convs' input gradient as matmuls (jaxsal.fastconv, same
    maps up to float rounding); False keeps XLA's transposed convs."""
    methods = tuple(dict.fromkeys(methods))
    bad = [m for m in methods if m not in FAMILY]
    if bad:
        raise SaliencyInputError(f"not a single-backward gradient method: {bad}; these are {FAMILY}")
    prep = prepare(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                   batch_size=batch_size)
    get_activation(layer_activation)
    uses_layer = any(m in LAYER_METHODS for m in methods)
    if not uses_layer and (layer is not None or layer_activation is not None):
        raise SaliencyInputError(f"layer= / layer_activation= apply to CAM methods only, not {methods}")
    lname, k = (_resolve_cached(apply_fn, params, as_float(prep.x[:1]), layer, layer_activation)
                if uses_layer else (None, 1))
    if per_frame and k == 1:
        nope = [m for m in methods if m not in PER_FRAME_METHODS]
        if nope:
            raise SaliencyInputError(
                f"{nope} give layer-resolution maps only; per_frame=True is for input-resolution "
                f"methods {PER_FRAME_METHODS}, or CAM methods on a layer run once per frame "
                f"(time-distributed trunk, output (N*T, h, w, K)); layer {lname!r} runs once "
                "per state")
    if k > 1 and prep.hwc[2] % k and any(m in ("g2gradcam", "guided_gradcam") for m in methods):
        raise SaliencyInputError(
            f"layer {lname!r} runs {k} times per state but the input has {prep.hwc[2]} channels, "
            f"not a multiple of {k}: g2gradcam/guided_gradcam cannot assign input channels to "
            "frames (frame-major stacks of k frames x C/k channels)")
    has_actions = prep.actions is not None
    key = ("family", apply_fn, prep.target_key, methods, lname, layer_activation, layout,
           bool(per_frame), prep.hwc[:2], has_actions, bool(fast_conv)) + ((k,) if k > 1 else ())
    fn = batching.cached_jit(key, lambda: _build(apply_fn, prep.target, methods, lname,
                                                 layer_activation, layout, bool(per_frame),
                                                 prep.hwc[:2], k, bool(fast_conv)))
    arrays = [prep.x] + ([prep.actions] if has_actions else [])
    return run_chunks(fn, params, arrays, k, prep.rows)


_LAYER_CACHE: dict = {}


def _resolve_cached(apply_fn, params, x1, layer, activation=None):
    """resolve_tap's (name, rows per state), cached per model structure and input shape."""
    k = (apply_fn, layer, activation, tuple(x1.shape), params_signature(params))
    try:
        hash(k)
    except TypeError:
        return resolve_tap(apply_fn, params, x1, layer, activation)
    if k not in _LAYER_CACHE:
        _LAYER_CACHE[k] = resolve_tap(apply_fn, params, x1, layer, activation)
    return _LAYER_CACHE[k]
