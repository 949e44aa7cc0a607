"""The single-backward methods as specs (jaxsal.engine): plain, guided and deconvnet gradients at
the input, and the CAM variants of the table jaxsal.backprop.cam.CAMS at a tapped layer.

Their share keys agree whenever they can be computed together (same strided-conv rule; CAM
methods also the same layer), so a list such as gradcam + gradcam_pp + guided_backprop +
g2gradcam runs one plain and one guided backward per chunk (`backward`, the shared piece), each
giving the input and the layer gradient its members need; XLA shares the forward between them.

Time-distributed trunks (a shared CNN run on the T frames of each state, so the tapped layer
outputs (N*T, h, w, K)) get one CAM per (state, frame): see jaxsal.backprop.cam.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsal import batching, caching, engine
from jaxsal.checks import as_float, to_nhwc
from jaxsal.errors import SaliencyInputError
from jaxsal.backprop import cam
from jaxsal.backprop.cam_site import CAM_ACTIVATIONS, cam_site
from jaxsal.backprop.layers import get_activation, resolve_tap, tap
from jaxsal.backprop.pathavg import interpolated_gradient, sample_gradient_sums
from jaxsal.backprop.rules import RULES, rewrite
from jaxsal.engine.spec import Prepared, Spec, Sums, objective
from jaxsal.registry import check_free
from jaxsal.targets import greedy

INPUT_RULES = {"gradient": "plain", "grad_x_input": "plain", "guided_backprop": "guided",
               "deconvnet": "deconvnet"}
"""Input-gradient methods and the ReLU rule of their backward pass."""


class Static(NamedTuple):
    """What one method of the family needs from the shared backward, and how it makes maps."""
    rule: str                 # the ReLU rule of its gradient
    fast_conv: bool
    per_frame: bool
    times_input: bool = False  # grad_x_input
    cam: cam.CamSpec | None = None  # CAM variants: the table's row
    layer: str | None = None  # CAM variants: the tapped layer (resolved) and activation
    activation: object = None
    k: int = 1                # rows of the tapped layer per state


def _needs(st: Static) -> set:
    """(rule, where) gradients a method needs; where is "x" (input) or "layer"."""
    if st.cam is None:
        return {(st.rule, "x")}
    return {(st.cam.rule, "layer")} | ({("guided", "x")} if st.cam.guided_input else set())


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _with_plain_derivative(fn, params, x, value):
    """`value` (= fn(params, x), computed elsewhere: under a rewritten backward rule), whose
    derivative is fn's own. No forward pass is added unless something differentiates it."""
    return value


@_with_plain_derivative.defjvp
def _with_plain_derivative_jvp(fn, primals, tangents):
    params, x, value = primals
    dparams, dx, _ = tangents
    if not jnp.issubdtype(x.dtype, jnp.inexact):  # integer frames: no tangent of their own
        _, t = jax.jvp(lambda p: fn(p, x), (params,), (dparams,))
    else:
        _, t = jax.jvp(fn, (params, x), (dparams, dx))
    return value, t


def backward(ctx, params, preps, rows):
    """The shared piece: one backward per ReLU rule the members need, with the input and/or
    the layer gradient each needs; {(rule, where): gradient, "A": tapped activations, "actions",
    "output": the clean model output}.
    Given rows.actions None, the first backward's forward (the clean one: the rules change only
    the backward pass) chooses them (Spec.chooses)."""
    sts = [p.static for p in preps]
    needs = set().union(*map(_needs, sts))
    site = next((st for st in sts if st.cam is not None), None)
    tapped = tap(ctx.apply_fn, site.layer, site.activation) if site is not None else None
    fast_conv, x, actions = sts[0].fast_conv, rows.x, rows.actions
    res, a_rule = {}, None
    if tapped is not None:
        a_shape = jax.eval_shape(lambda p, xx: tapped(p, xx, 0.0)[1], params, x)
        eps0 = jnp.zeros(a_shape.shape, a_shape.dtype)

    def score(y, acts):
        acts = greedy(ctx.target, y) if acts is None else acts
        return objective(ctx.target, y, acts).sum(), (acts, jax.lax.stop_gradient(y))

    for rule in sorted({r for r, _ in needs}):
        want_x = (rule, "x") in needs
        if (rule, "layer") in needs:
            def f(eps, xx, p, acts):
                y, A = tapped(p, xx, eps)
                value, aux = score(y, acts)
                return value, (A, aux)
            grads, (A, (actions, out)) = jax.grad(rewrite(f, rule, fast_conv), (0, 1) if want_x else (0,),
                                                  has_aux=True)(eps0, x, params, actions)
            res[(rule, "layer")] = grads[0]
            if rule == "plain":
                res["A"] = A
            a_rule = A
            if want_x:
                res[(rule, "x")] = grads[1]
        else:
            def f(xx, p, acts):
                return score(ctx.apply_fn(p, xx), acts)
            res[(rule, "x")], (actions, out) = jax.grad(rewrite(f, rule, fast_conv), has_aux=True)(x, params, actions)
        res.setdefault("output", out)  # the first backward's forward: the clean model output
    if a_rule is not None and "A" not in res:
        # A's value is the same under every rule, but its derivative (a gradient taken through the
        # maps, e.g. in the parameters) must be the model's, not the rule's
        res["A"] = _with_plain_derivative(lambda p, xx: tapped(p, xx, 0.0)[1], params, x, a_rule)
    res["actions"] = actions
    return res


def finish(attr, layout, per_frame):
    """Input-shaped attribution -> NHWC (N, H, W, C) if per_frame else summed over C (N, H, W)."""
    a = to_nhwc(attr, layout)
    return a if per_frame else a.sum(-1)


# ------------------------------------------------------------------ input-gradient methods
def _prepare_input(rule, times_input, call, apply_fn, params, *, key=None, per_frame=False, fast_conv=True):
    del call, apply_fn, params, key  # key: accepted (a list call passes it to every method), unused
    return Prepared(Static(rule, bool(fast_conv), bool(per_frame), times_input))


def _input_chunk(ctx, params, prep, rows, group, shared):
    g = shared[(prep.static.rule, "x")]
    return rows.x * g if prep.static.times_input else g


def _input_finalize(ctx, params, prep, rows, acc):
    return finish(acc, ctx.layout, prep.static.per_frame)


def _share_key(options):
    """Methods of the family with the same strided-conv rule share; CAM methods also need the
    same layer settings (input methods join any layer)."""
    layer = (options["layer"], options["layer_activation"]) if "layer" in options else None
    return ("single_backward", options["fast_conv"]), layer


def _sample_sums(ctx, params, prep, x, xs, weights, actions, squares, fast_prefix):
    st = prep.static
    return sample_gradient_sums(ctx.apply_fn, ctx.target, params, x, xs, weights, actions, squares=squares,
                                rule=st.rule, fast_conv=st.fast_conv, fast_prefix=fast_prefix)


def _path_sums(ctx, params, prep, x0, x, alphas, weights, actions, fast_prefix):
    st = prep.static
    return interpolated_gradient(ctx.apply_fn, ctx.target, params, x0, x, alphas, weights, actions,
                                 rule=st.rule, fast_conv=st.fast_conv, fast_prefix=fast_prefix)


GRADIENT_SUMS = Sums(_sample_sums, _path_sums)
INPUT_OPTIONS = {"key": None, "per_frame": False, "fast_conv": True}


def input_spec(name: str, doc: str) -> Spec:
    """The spec of an input-gradient method of INPUT_RULES."""
    times_input = name == "grad_x_input"
    return Spec(name, functools.partial(_prepare_input, INPUT_RULES[name], times_input), _input_chunk,
                _input_finalize, options=dict(INPUT_OPTIONS), kind="input" if times_input else "gradient",
                shared=backward, share_key=_share_key, chooses=True, sums=None if times_input else GRADIENT_SUMS, doc=doc)


# ------------------------------------------------------------------ CAM variants
CAM_OPTIONS = {"key": None, "layer": None, "per_frame": False, "layer_activation": None, "fast_conv": True}


def _prepare_cam(name, row, call, apply_fn, params, *, key=None, layer=None, per_frame=False,
                 layer_activation=None, fast_conv=True):
    del key
    if isinstance(layer_activation, str) and layer_activation in CAM_ACTIVATIONS:
        layer, layer_activation = _structure_cached(cam_site, apply_fn, params, call, layer, layer_activation)
    get_activation(layer_activation)
    lname, k = _structure_cached(resolve_tap, apply_fn, params, call, layer, layer_activation)
    if per_frame and k == 1 and not row.guided_input:
        raise SaliencyInputError(
            f"{name!r} gives layer-resolution maps only; per_frame=True is for input-resolution methods "
            f"({', '.join(INPUT_RULES)}, guided_gradcam, g2gradcam, smoothgrad, integrated_gradients), or "
            f"CAM methods on a layer run once per frame (time-distributed trunk, output (N*T, h, w, K)); "
            f"layer {lname!r} runs once per state")
    if k > 1 and call.hwc[2] % k and row.guided_input:
        raise SaliencyInputError(
            f"layer {lname!r} runs {k} times per state but the input has {call.hwc[2]} channels, not a "
            f"multiple of {k}: {name} cannot assign input channels to frames (frame-major stacks of k "
            "frames x C/k channels)")
    return Prepared(Static(row.rule, bool(fast_conv), bool(per_frame), cam=row, layer=lname,
                           activation=layer_activation, k=k), rows_per_state=k)


def _cam_chunk(ctx, params, prep, rows, group, shared):
    st = prep.static
    gx = to_nhwc(shared[("guided", "x")], ctx.layout) if st.cam.guided_input else None
    hw = to_nhwc(rows.x, ctx.layout).shape[1:3]
    return cam.cam_maps(st.cam, shared["A"], shared[(st.cam.rule, "layer")], gx, hw, st.k, st.per_frame)


_LAYER_CACHE = caching.LRU("layer sites", 256)


def _structure_cached(fn, apply_fn, params, call, layer, activation=None):
    """fn(apply_fn, params, x1, layer, activation) on the call's first state x1 as float32
    (resolve_tap, cam_site: each traces the model), cached per model structure (the call's
    params_sig) and state shape, so repeated calls skip the tracing (and the device copy of x1)."""
    x = call.x
    run = lambda: fn(apply_fn, params, as_float(batching.head(x)), layer, activation)  # noqa: E731
    try:
        k = caching.static_key((fn, apply_fn, layer, activation)) + (
            tuple(x.shape[1:]), call.params_sig,
            batching.is_traced(params, x))  # eager calls also check values (resolve_tap)
        hash(k)
    except TypeError:
        return run()
    return _LAYER_CACHE.get_or_build(k, run)


def cam_spec(name: str, row: cam.CamSpec, doc: str, example: dict | None = None) -> Spec:
    """The spec of CAM variant `row`; `example`: its conformance case's options (default: the
    conformance model's layer "conv2")."""
    return Spec(name, functools.partial(_prepare_cam, name, row), _cam_chunk, options=dict(CAM_OPTIONS),
                example={"layer": "conv2"} if example is None else dict(example), shared=backward,
                share_key=_share_key, chooses=True, doc=doc)


def register_cam(name: str, weights=None, *, rule: str = "plain", normalise: bool = False,
                 guided_input: bool = False, doc: str | None = None, example: dict | None = None,
                 replace: bool = False):
    """Add a CAM variant by its channel weights and register it as `jaxsal.explain(method=name)`.

    Usable as a decorator on the weight function (`@jaxsal.register_cam("mycam")`). The variant
    gets everything the CAM engine gives: layer=, layer_activation=, per-frame maps, one shared
    backward in method lists, jit / vmap / lax.scan. `jaxsal.unregister(name)` removes it.

    Args:
        name (str): the method name.
        weights (Callable | None): w = weights(A, g), (N, h, w, K), (N, h, w, K) -> (N, K), from
            the tapped activations A and their gradient g; None: return a decorator.
        rule (str): the ReLU rule of g = dY/dA, "plain" or "guided".
        normalise (bool): divide each map by its max (per state, over its frames).
        guided_input (bool): multiply by guided backprop, giving input-resolution maps.
        doc (str | None): the method's docstring; None: the docstring of `weights`.
        example (dict | None): options of its generated conformance case; None: {"layer": "conv2"}.
        replace (bool): allow a name another method holds.

    Returns:
        Callable: the registered method function (a decorator when `weights` is None).

    Raises:
        ValueError: `rule` is not "plain" or "guided".
        jaxsal.SaliencyInputError: `name` is empty or another method holds it and replace is False.
    """
    if weights is None:
        return lambda w: register_cam(name, w, rule=rule, normalise=normalise, guided_input=guided_input,
                                      doc=doc, example=example, replace=replace)
    if rule not in ("plain", "guided"):
        raise ValueError(f"rule must be 'plain' or 'guided', got {rule!r}")
    ident = (getattr(weights, "__module__", __name__), getattr(weights, "__qualname__", repr(weights)))
    check_free(name, ident, replace)  # before the table changes
    row = cam.CamSpec(weights, rule, bool(normalise), bool(guided_input))
    spec = cam_spec(name, row, doc or (weights.__doc__ or f"CAM variant {name!r}"), example)
    fn = engine.register(spec, module=ident[0], identity=ident, replace=True)  # keeps the row it shadows
    cam.CAMS[name] = row
    return fn


def _prepare_ruled(call, apply_fn, params, *, rule="plain", key=None, per_frame=False, fast_conv=True):
    if rule not in RULES:
        raise SaliencyInputError(f"rule must be one of {RULES}, got {rule!r}")
    return _prepare_input(rule, False, call, apply_fn, params, key=key, per_frame=per_frame, fast_conv=fast_conv)


RULED_GRADIENT = Spec("gradient", _prepare_ruled, _input_chunk, _input_finalize,
                      options={"rule": "plain", **INPUT_OPTIONS}, kind="gradient", shared=backward,
                      share_key=_share_key, sums=GRADIENT_SUMS, chooses=True,
                      doc="The input gradient through `rule` ReLUs (plain, guided, deconvnet): SmoothGrad's and "
                          "IG's inner method.")


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
