"""One engine for every single-backward method: plain, guided and deconvnet gradients at the
input and at a tapped layer, computed together in one jitted function per chunk. CAM variants
come from the table jaxsal.backprop.cam.CAMS; `register_cam` adds one and registers it.

Asking for several methods at once (e.g. gradcam + gradcam_pp + guided_backprop + g2gradcam)
shares the work: one plain and/or one guided backward gives all the maps; XLA shares the
forward pass between them.

Time-distributed trunks (a shared CNN run on the T frames of each state, so the tapped layer
outputs (N*T, h, w, K)) get one CAM per (state, frame): see jaxsal.backprop.cam.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal import batching
from jaxsal.checks import as_float, check_call, params_signature, to_nhwc
from jaxsal.errors import SaliencyInputError
from jaxsal.backprop import cam
from jaxsal.backprop.common import finish, objective, run_chunks
from jaxsal.backprop.cam_site import CAM_ACTIVATIONS, cam_site
from jaxsal.backprop.layers import get_activation, resolve_tap, tap
from jaxsal.backprop.rules import rewrite
from jaxsal.registry import check_free, register

INPUT_RULES = {"gradient": "plain", "grad_x_input": "plain", "guided_backprop": "guided",
               "deconvnet": "deconvnet"}
"""Input-gradient methods of the family and the ReLU rule of their backward pass."""
LAYER_METHODS = cam.CAMS
"""The CAM variants (name -> CamSpec), live: jaxsal.register_cam adds to it."""
FAMILY: dict = dict.fromkeys(INPUT_RULES)
"""Every single-backward method (input-gradient methods and CAM variants), live."""


def _needs(m, spec=None) -> set:
    """(rule, where) gradients method m (CamSpec `spec`, default the table's) needs; where is
    "x" (input) or "layer"."""
    if m in INPUT_RULES:
        return {(INPUT_RULES[m], "x")}
    spec = spec or cam.CAMS[m]
    return {(spec.rule, "layer")} | ({("guided", "x")} if spec.guided_input else set())


def per_frame_ok(m) -> bool:
    """Input-resolution maps (per_frame=True gives one per input channel)."""
    return m in INPUT_RULES or cam.CAMS[m].guided_input


def _build(apply_fn, tgt, methods, specs, layer, activation, layout, per_frame, k=1,
           fast_conv=True):
    """The jitted per-chunk function; specs: each method's CamSpec (None for input-gradient
    methods); k = rows of the tapped layer per state (1: ordinary). The frame size comes from
    the traced chunk (jit retraces per shape)."""
    specs = dict(zip(methods, specs))
    needs = set().union(*(_needs(m, specs[m]) for m in methods))
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
                grads, A = jax.grad(rewrite(f, rule, fast_conv), argnums, has_aux=True)(eps0, x,
                                                                                      params)
                res["A"] = A
                res[(rule, "layer")] = grads[0]
                if want_x:
                    res[(rule, "x")] = grads[1]
            else:
                def f(xx, p):
                    return objective(tgt, apply_fn(p, xx), actions).sum()
                res[(rule, "x")] = jax.grad(rewrite(f, rule, fast_conv))(x, params)
        out = {}
        hw = to_nhwc(x, layout).shape[1:3]
        for m in methods:
            if m in INPUT_RULES:
                g = res[(INPUT_RULES[m], "x")]
                out[m] = finish(x * g if m == "grad_x_input" else g, layout, per_frame)
                continue
            spec = specs[m]
            gx = to_nhwc(res[("guided", "x")], layout) if spec.guided_input else None
            out[m] = cam.cam_maps(spec, res["A"], res[(spec.rule, "layer")], gx, hw, k, per_frame)
        return out

    return fn


def compute(methods, apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
            batch_size=None, layer=None, per_frame=False, layer_activation=None,
            fast_conv=True):
    """Maps of several single-backward methods at once: dict name -> (N, H, W[, C]).

    fast_conv (default True): strided convs' input gradient as matmuls (jaxsal.backprop.strided_conv, same
    maps up to float rounding); False keeps XLA's transposed convs."""
    methods = tuple(dict.fromkeys(methods))
    bad = [m for m in methods if m not in FAMILY]
    if bad:
        raise SaliencyInputError(f"not a single-backward gradient method: {bad}; these are "
                                 f"{tuple(FAMILY)}")
    prep = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    layout = prep.layout  # resolved: the caller's, else the model's declared one
    uses_layer = any(m in LAYER_METHODS for m in methods)
    x1 = as_float(batching.head(prep.x))
    if uses_layer and isinstance(layer_activation, str) and layer_activation in CAM_ACTIVATIONS:
        layer, layer_activation = _structure_cached(cam_site, apply_fn, params, x1, layer, layer_activation)
    get_activation(layer_activation)
    if not uses_layer and (layer is not None or layer_activation is not None):
        raise SaliencyInputError(f"layer= / layer_activation= apply to CAM methods only, not {methods}")
    lname, k = (_structure_cached(resolve_tap, apply_fn, params, x1, layer, layer_activation)
                if uses_layer else (None, 1))
    if per_frame and k == 1:
        nope = [m for m in methods if not per_frame_ok(m)]
        if nope:
            raise SaliencyInputError(
                f"{nope} give layer-resolution maps only; per_frame=True is for input-resolution "
                f"methods {tuple(m for m in FAMILY if per_frame_ok(m))}, or CAM methods on a layer run once per frame "
                f"(time-distributed trunk, output (N*T, h, w, K)); layer {lname!r} runs once "
                "per state")
    if k > 1 and prep.hwc[2] % k and any(m in cam.CAMS and cam.CAMS[m].guided_input
                                          for m in methods):
        raise SaliencyInputError(
            f"layer {lname!r} runs {k} times per state but the input has {prep.hwc[2]} channels, "
            f"not a multiple of {k}: g2gradcam/guided_gradcam cannot assign input channels to "
            "frames (frame-major stacks of k frames x C/k channels)")
    # the CAM specs are arguments (the table is live: register_cam may replace a variant)
    specs = tuple(cam.CAMS.get(m) for m in methods)
    fn = batching.cached_jit(_build, apply_fn, prep.target, methods, specs, lname,
                             layer_activation, layout, bool(per_frame), k, bool(fast_conv))
    arrays = [prep.x] + ([prep.actions] if prep.actions is not None else [])
    return run_chunks(fn, params, arrays, k, prep.rows)


_LAYER_CACHE = batching.LRU("layer sites", 256)


def _structure_cached(fn, apply_fn, params, x1, layer, activation=None):
    """fn(apply_fn, params, x1, layer, activation) (resolve_tap, cam_site: each traces the model),
    cached per model structure and input shape and dtype, so repeated calls skip the tracing."""
    try:
        k = batching.static_key((fn, apply_fn, layer, activation)) + (
            tuple(x1.shape), str(x1.dtype), params_signature(params),
            batching.is_traced(params, x1))  # eager calls also check values (resolve_tap)
        hash(k)
    except TypeError:
        return fn(apply_fn, params, x1, layer, activation)
    return _LAYER_CACHE.get_or_build(k, lambda: fn(apply_fn, params, x1, layer, activation))


def register_cam(name: str, weights=None, *, rule: str = "plain", normalise: bool = False,
                 guided_input: bool = False, doc: str | None = None, replace: bool = False):
    """Add a CAM variant (its channel weights w = weights(A, g) -> (N, K)) and register it as
    `jaxsal.explain(method=name)`. Usable as a decorator on the weight function. rule: the
    ReLU rule of dY/dA ("plain"/"guided"); normalise: maps / their max; guided_input: times
    guided backprop (input resolution); replace: allow a name another method holds (refused
    otherwise). Returns the registered method."""
    if weights is None:
        return lambda w: register_cam(name, w, rule=rule, normalise=normalise,
                                      guided_input=guided_input, doc=doc, replace=replace)
    if rule not in ("plain", "guided"):
        raise ValueError(f"rule must be 'plain' or 'guided', got {rule!r}")
    ident = (getattr(weights, "__module__", __name__), getattr(weights, "__qualname__", repr(weights)))
    check_free(name, ident, replace)  # before the table changes
    cam.CAMS[name] = cam.CamSpec(weights, rule, bool(normalise), bool(guided_input))
    FAMILY[name] = None

    def method(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
               key=None, batch_size=None, layer=None, per_frame=False, layer_activation=None,
               fast_conv=True):
        return compute((name,), apply_fn, params, obs, target=target, actions=actions,
                       layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                       layer_activation=layer_activation, fast_conv=fast_conv)[name]

    method.__name__ = method.__qualname__ = name
    method.__module__ = ident[0]  # who defined the variant
    method.jaxsal_identity = ident
    method.__doc__ = doc or (weights.__doc__ or f"CAM variant {name!r}")
    return register(name, replace=True)(method)


gradcam = register_cam("gradcam", cam.gradcam_weights, doc=(
    "Grad-CAM maps (N, H, W) of the named layer (default: last conv-like layer); per-frame maps "
    "(N, H, W, T) with per_frame=True on a time-distributed layer (see jaxsal.backprop.cam)."))
gradcam_pp = register_cam("gradcam_pp", cam.gradcam_pp_weights, doc=(
    "Grad-CAM++ maps (N, H, W) of the named layer ((N, H, W, T) per frame, as gradcam)."))
g1gradcam = register_cam("g1gradcam", cam.gradcam_weights, rule="guided", normalise=True, doc=(
    "G1Grad-CAM (Paper A): Grad-CAM with guided-ReLU gradients, each map divided by its max "
    "((N, H, W, T) per frame, as gradcam, divided by the max over the state's frames)."))
g2gradcam = register_cam("g2gradcam", cam.gradcam_weights, rule="guided", normalise=True,
                         guided_input=True, doc=(
    "G2Grad-CAM (Paper A): max(G1, 0) * max(guided backprop, 0), per frame then summed."))
guided_gradcam = register_cam("guided_gradcam", cam.gradcam_weights, guided_input=True, doc=(
    "Guided Grad-CAM: max(Grad-CAM, 0) * max(guided backprop, 0), per frame then summed."))
