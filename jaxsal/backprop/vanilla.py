"""Input-gradient methods: gradient, gradient x input, SmoothGrad (+SG^2, VarGrad), Integrated Gradients.

SmoothGrad and IG evaluate many copies per state; `batch_size` bounds the model rows per
compiled call (states x samples), splitting samples/steps into equal groups when needed, so
any number of states and samples fits in memory. The explained action is fixed once from
the clean input.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching
from jaxsal.checks import as_float, check_call, check_positive_int
from jaxsal.errors import SaliencyInputError
from jaxsal.backprop.common import (as_key, choose_actions, finish, objective, sample_groups,
                                    state_index)
from jaxsal.backprop.family import compute
from jaxsal.backprop.pathavg import interpolated_gradient, sample_gradient_sums
from jaxsal.backprop.rules import RULES
from jaxsal.registry import register

SMOOTHGRAD_VARIANTS = ("mean", "sg2", "vargrad")
IG_BASELINES = ("black", "blur", "uniform")
IG_RULES = ("riemann_right", "riemann_middle", "riemann_left", "riemann_trapezoid",
            "gausslegendre")


def _family(name, apply_fn, params, obs, **kw):
    return compute((name,), apply_fn, params, obs, **kw)[name]


@register("gradient")
def gradient(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
             batch_size=None, per_frame=False, fast_conv=True):
    """Vanilla gradient dy/dx (Simonyan 2014), signed: (N, H, W) summed over frames or (N, H, W, C)."""
    return _family("gradient", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, per_frame=per_frame,
                   fast_conv=fast_conv)


@register("grad_x_input")
def grad_x_input(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
                 key=None, batch_size=None, per_frame=False, fast_conv=True):
    """Gradient x input, x * dy/dx on the observation's own value scale, signed."""
    return _family("grad_x_input", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, per_frame=per_frame,
                   fast_conv=fast_conv)


def check_rule(rule):
    """A backward rule name for SmoothGrad / IG: plain, guided or deconvnet."""
    if rule not in RULES:
        raise SaliencyInputError(f"rule must be one of {RULES}, got {rule!r}")
    return rule


def _loop(fn, params, statics_per_group, arrays, size, finalize):
    """States in chunks of `size` (outer), sample groups (inner, accumulated), then
    finalize(chunk_arrays, accumulated) per chunk: memory is bounded by the chunk."""
    traced = batching.is_traced(params, arrays, statics_per_group)

    def chunk_fn(chunk):
        acc = batching.accumulate(lambda st: fn(params, st, *chunk), statics_per_group, traced)
        return finalize(chunk, acc)

    return batching.run(chunk_fn, list(arrays), size, traced)


def _states_per_chunk(n, rows, s):
    return batching.chunk_size(n, max(1, rows // s), 1)


@register("smoothgrad", stochastic=True)
def smoothgrad(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
               batch_size=None, per_frame=False, n_samples=50, sigma=0.15, variant="mean",
               rule="plain", fast_conv=True, fast_prefix=True):
    """SmoothGrad (Smilkov 2017): gradients of n_samples noisy copies x + N(0, s^2).

    s = sigma * (max(x) - min(x)) per state (the paper's noise level; 0.15 default).
    variant "mean": mean gradient; "sg2": mean squared gradient (SmoothGrad^2); "vargrad":
    variance of the gradients. Noise for state i, sample j comes from fold_in(fold_in(key, i), j),
    so results do not depend on batch_size. rule="guided"/"deconvnet" takes each gradient
    through guided/deconvnet ReLUs (guided SmoothGrad); fast_conv as for `gradient`.
    fast_prefix (variant "mean"): the model's affine input prefix (e.g. a first conv) is
    transposed once per state instead of once per sample, exactly (`jaxsal.backprop.pathavg`);
    False runs every sample's full backward.
    """
    key = as_key(key, "smoothgrad")
    rule = check_rule(rule)
    n_samples = check_positive_int("n_samples", n_samples)
    if not isinstance(sigma, (int, float)) or isinstance(sigma, bool) or not np.isfinite(sigma) \
            or sigma < 0:
        raise SaliencyInputError(f"sigma must be a finite number >= 0 (fraction of each state's "
                                 f"value range), got {sigma!r}")
    if variant not in SMOOTHGRAD_VARIANTS:
        raise SaliencyInputError(f"variant must be one of {SMOOTHGRAD_VARIANTS}, got {variant!r}")
    prep = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    layout = prep.layout  # resolved: the caller's, else the model's declared one
    acts = choose_actions(apply_fn, params, prep)
    n = prep.x.shape[0]
    s, groups = sample_groups(n_samples, prep.rows)
    tgt = prep.target

    def build():
        def fn(params, statics, x, a, idx):
            k, offset = statics
            x = as_float(x)
            j = offset + jnp.arange(s, dtype=jnp.int32)
            valid = (j < n_samples).astype(x.dtype)
            rng = x.reshape(x.shape[0], -1)
            scale = sigma * (rng.max(1) - rng.min(1))

            # drawn in NHWC order: the same noise for either layout; the shape comes from the
            # traced chunk, never from the first call (jit retraces per frame shape)
            hwc = x.shape[1:] if layout == "NHWC" else (x.shape[2], x.shape[3], x.shape[1])

            def draw(kk):
                e = jax.random.normal(kk, hwc, x.dtype)
                return e if layout == "NHWC" else jnp.transpose(e, (2, 0, 1))

            def noise(i):
                ki = jax.random.fold_in(k, i)
                return jax.vmap(lambda jj: draw(jax.random.fold_in(ki, jj)))(j)
            eps = jax.vmap(noise)(idx) * scale.reshape((-1, 1) + (1,) * (x.ndim - 1))
            xn = (x[:, None] + eps).reshape((-1,) + x.shape[1:])
            s1, s2 = sample_gradient_sums(apply_fn, tgt, params, x, xn, valid, a,
                                          squares=squares, rule=rule, fast_conv=fast_conv,
                                          fast_prefix=fast_prefix)
            return s1, (s2 if squares else jnp.zeros((), s1.dtype))
        return fn

    squares = variant != "mean"
    sigma = float(sigma)
    fn = batching.cached_jit(build)

    def finalize(chunk, acc):
        s1, s2 = acc
        mean = s1 / n_samples
        if variant == "mean":
            out = mean
        elif variant == "sg2":
            out = s2 / n_samples
        else:
            out = s2 / n_samples - mean * mean
        return finish(out, layout, per_frame)

    statics = [(key, jnp.int32(gi * s)) for gi in range(groups)]
    size = _states_per_chunk(n, prep.rows, s)
    return _loop(fn, params, statics, [prep.x, acts, state_index(n)], size, finalize)


def ig_alphas(steps: int, rule: str = "riemann_right"):
    """Interpolation points alpha in [0, 1] and weights (summing to 1) for `steps` IG steps."""
    k = np.arange(steps, dtype=np.float64)
    if rule == "riemann_right":
        a, w = (k + 1) / steps, np.full(steps, 1.0 / steps)
    elif rule == "riemann_left":
        a, w = k / steps, np.full(steps, 1.0 / steps)
    elif rule == "riemann_middle":
        a, w = (k + 0.5) / steps, np.full(steps, 1.0 / steps)
    elif rule == "riemann_trapezoid":
        if steps < 2:
            raise SaliencyInputError("method='riemann_trapezoid' needs steps >= 2")
        a = k / (steps - 1)
        w = np.full(steps, 1.0 / (steps - 1))
        w[[0, -1]] /= 2
    elif rule == "gausslegendre":
        t, wt = np.polynomial.legendre.leggauss(steps)
        a, w = (t + 1) / 2, wt / 2
    else:
        raise SaliencyInputError(f"IG rule must be one of {IG_RULES}, got {rule!r}")
    return a.astype(np.float32), w.astype(np.float32)


def _blur(x, sigma, layout):
    """Gaussian blur over the spatial axes only (never across stacked frames)."""
    r = max(1, int(np.ceil(3 * sigma)))
    t = np.arange(-r, r + 1, dtype=np.float32)
    k = np.exp(-t * t / (2 * sigma * sigma))
    k = jnp.asarray(k / k.sum())
    hax, wax = (1, 2) if layout == "NHWC" else (2, 3)

    def conv1d(v, axis):
        v = jnp.moveaxis(v, axis, -1)
        pad = [(0, 0)] * (v.ndim - 1) + [(r, r)]
        vp = jnp.pad(v, pad, mode="edge")
        flat = vp.reshape(-1, vp.shape[-1])
        out = jax.vmap(lambda row: jnp.convolve(row, k, mode="valid"))(flat)
        return jnp.moveaxis(out.reshape(v.shape), -1, axis)

    return conv1d(conv1d(x, hax), wax)


@register("integrated_gradients")
def integrated_gradients(apply_fn, params, obs, *, target="q_chosen", actions=None,
                         layout=None, key=None, batch_size=None, per_frame=False, steps=50,
                         baseline="black", method="riemann_right", blur_sigma=5.0,
                         return_error=False, rule="plain", fast_conv=True, fast_prefix=True):
    """Integrated Gradients (Sundararajan 2017): (x - x0) * sum_k w_k dy/dx(x0 + a_k (x - x0)).

    baseline: "black" (zeros), "blur" (spatial Gaussian blur of x, blur_sigma px), "uniform"
    (U(min x, max x) per state, needs key) or an array broadcastable to obs. method: the
    quadrature (default right Riemann, alpha in (0, 1]). return_error=True also returns the
    per-state completeness error sum(attributions) - (y(x) - y(x0)), shape (N,).
    rule="guided"/"deconvnet": path gradients through guided/deconvnet ReLUs (guided IG; then
    completeness does not hold). fast_conv as for `gradient`. fast_prefix: the model's affine
    input prefix (e.g. a first conv) runs on the two end points and is transposed once per state
    instead of once per step, exactly (`jaxsal.backprop.pathavg`); False runs every step whole.
    """
    steps = check_positive_int("steps", steps)
    rule = check_rule(rule)
    alphas, weights = ig_alphas(steps, method)
    prep = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    layout = prep.layout  # resolved: the caller's, else the model's declared one
    x = prep.x
    n = x.shape[0]
    ukey = jnp.zeros((2,), jnp.uint32)
    base_arr = None          # (N, ...) per-state baseline, chunked with the states
    base_const = None        # one baseline broadcast to every state
    if isinstance(baseline, str):
        if baseline not in IG_BASELINES:
            raise SaliencyInputError(f"baseline must be one of {IG_BASELINES} or an array, "
                                     f"got {baseline!r}")
        if baseline == "blur" and (not isinstance(blur_sigma, (int, float)) or not blur_sigma > 0):
            raise SaliencyInputError(f"blur_sigma must be > 0, got {blur_sigma!r}")
        if baseline == "uniform":
            ukey = as_key(key, "integrated_gradients (baseline='uniform')")
        kind = baseline
    else:
        b = np.shape(baseline)
        try:
            ok = len(b) <= x.ndim and np.broadcast_shapes(b, x.shape) == tuple(x.shape)
        except ValueError:
            ok = False
        if not ok:
            raise SaliencyInputError(f"baseline array of shape {b} does not broadcast to obs "
                                     f"shape {tuple(x.shape)} (same layout as obs)")
        arr = jnp.asarray(baseline, jnp.float32)
        if not batching.is_traced(arr) and not bool(jnp.isfinite(arr).all()):
            raise SaliencyInputError("baseline contains NaN or inf values")
        if len(b) == x.ndim and b[0] == n and n > 1:
            kind, base_arr = "per_state", jnp.broadcast_to(arr, x.shape)
        else:
            kind = "const"
            base_const = jnp.broadcast_to(arr.reshape(b[1:] if len(b) == x.ndim else b),
                                          x.shape[1:])
    acts = choose_actions(apply_fn, params, prep)
    s, groups = sample_groups(steps, prep.rows)
    pad = s * groups - steps
    alphas = np.concatenate([alphas, np.zeros(pad, np.float32)])
    weights = np.concatenate([weights, np.zeros(pad, np.float32)])
    tgt = prep.target
    bsig = float(blur_sigma) if kind == "blur" else 0.0

    def make_x0(x, idx, extra, k):
        if kind == "black":
            return jnp.zeros_like(x)
        if kind == "blur":
            return _blur(x, bsig, layout)
        if kind == "uniform":
            flat = x.reshape(x.shape[0], -1)
            lo, hi = flat.min(1), flat.max(1)
            u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(k, i), x.shape[1:]))(idx)
            shp = (-1,) + (1,) * (x.ndim - 1)
            return lo.reshape(shp) + u * (hi - lo).reshape(shp)
        if kind == "per_state":
            return extra
        return jnp.broadcast_to(extra, x.shape)

    def build():
        def fn(params, statics, x, a, idx, extra):
            al, wt, k = statics
            x = as_float(x)
            x0 = make_x0(x, idx, extra, k)
            return interpolated_gradient(apply_fn, tgt, params, x0, x, al, wt, a, rule=rule,
                                         fast_conv=fast_conv, fast_prefix=fast_prefix)
        return fn

    def build_finish():
        def fin(params, k, x, a, idx, extra, avg):
            x = as_float(x)
            x0 = make_x0(x, idx, extra, k)
            attr = (x - x0) * avg
            maps = finish(attr, layout, per_frame)
            if not return_error:
                return maps
            y = objective(tgt, apply_fn(params, x), a)
            y0 = objective(tgt, apply_fn(params, x0), a)
            return maps, attr.reshape(x.shape[0], -1).sum(1) - (y - y0)
        return fin

    fn = batching.cached_jit(build)
    fin = batching.cached_jit(build_finish)
    statics = [(jnp.asarray(alphas[i * s:(i + 1) * s]), jnp.asarray(weights[i * s:(i + 1) * s]),
                ukey) for i in range(groups)]
    size = _states_per_chunk(n, prep.rows, s)
    idx = state_index(n)
    if kind == "per_state":
        arrays = [x, acts, idx, base_arr]
    else:
        extra = base_const if kind == "const" else jnp.zeros((), jnp.float32)
        arrays = [x, acts, idx]
        fn = _with_extra(fn, extra)
        fin = _with_extra_fin(fin, extra)
    return _loop(fn, params, statics, arrays, size,
                 lambda chunk, acc: fin(params, ukey, *chunk, acc))


def _with_extra(fn, extra):
    """fn(params, statics, x, a, idx, extra) with a fixed non-chunked `extra`."""
    return lambda params, statics, x, a, idx: fn(params, statics, x, a, idx, extra)


def _with_extra_fin(fin, extra):
    return lambda params, k, x, a, idx, avg: fin(params, k, x, a, idx, extra, avg)
