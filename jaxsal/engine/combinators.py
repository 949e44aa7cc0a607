"""Combinators: methods made of other methods (Captum's NoiseTunnel, Integrated Gradients of any
gradient method). Each takes a gradient-family or CAM spec and returns a spec.

`noise_tunnel(spec)`: the spec's attributions of n noisy copies x + N(0, s^2) of each state,
s = sigma * (max x - min x) per state (SmoothGrad's noise level), averaged ("mean"), their
squares averaged ("squared", SmoothGrad^2) or their variance ("vargrad"); input-resolution
attributions are averaged before the channel sum, so squares are per input element.

`path_integral(spec)`: sum_k w_k a(x0 + alpha_k (x - x0)) over a quadrature of the straight path
from a baseline x0 to x. For an input-gradient spec (gradient, guided_backprop, deconvnet) it is
multiplied by (x - x0): Integrated Gradients (of that gradient); for any other spec (CAM maps,
gradient x input) it is the path average of its maps.

Noise of state i, sample j comes from fold_in(fold_in(key, first_index + i), j) (i: the state's
position in the call; option first_index, default 0, the call's offset in a larger buffer), so maps
depend neither on batch_size nor on how a buffer is split into calls. Input-gradient specs with a `sums` piece take the
affine-prefix fast path (jaxsal.backprop.pathavg): the same sums, exactly, with the model's
affine input prefix transposed once per state.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching, registry, sizing
from jaxsal.checks import as_key, check_positive_float, check_positive_int
from jaxsal.engine.spec import Prepared, Rows, Spec, objective
from jaxsal.errors import SaliencyInputError

VARIANTS = ("mean", "squared", "vargrad")
VARIANT_NAMES = {"mean": "mean", "squared": "squared", "sg2": "squared", "vargrad": "vargrad"}
"""Accepted names of the noise tunnel's variants ("sg2": SmoothGrad^2, the same as "squared")."""
BASELINES = ("black", "blur", "uniform")
QUADRATURES = ("riemann_right", "riemann_middle", "riemann_left", "riemann_trapezoid", "gausslegendre")


def spec_of(method) -> Spec:
    """A spec, or the spec registered under a method name."""
    if isinstance(method, Spec):
        return method
    if isinstance(method, str) and method in registry.SPECS:
        return registry.SPECS[method]
    raise SaliencyInputError(f"{method!r} is not a method the engine runs; choose one of "
                             f"{', '.join(sorted(registry.SPECS))} or pass a jaxsal.engine.Spec")


def _inner(method, combinator) -> Spec:
    spec = spec_of(method)
    if spec.kind not in ("gradient", "input", "maps"):
        raise SaliencyInputError(f"{combinator} takes a gradient or CAM method, not the {spec.kind} method {spec.name!r}")
    return spec


def _per_state_sum(g, weights, n):
    """(n*s, ...) rows -> (n, ...) sums over each state's s rows weighted by weights (s,)."""
    s = weights.shape[-1]
    g = g.reshape((n, s) + g.shape[1:])
    return (g * weights.astype(g.dtype).reshape((1, s) + (1,) * (g.ndim - 2))).sum(1)


def _inner_prepare(inner, call, apply_fn, params, options, total):
    ip = inner.prepare(call, apply_fn, params, **options)
    if len(ip.groups) != 1 or ip.groups[0] is not None:
        raise SaliencyInputError(f"{inner.name!r} has an inner loop of its own; it cannot be combined")
    sizes = sizing.plan(call.x.shape[0], call.rows, ip.rows_per_state, total)
    return ip, sizes.group, sizes.groups


def _expanded_parts(inner, ctx, params, ip, rows, xs, s):
    """The inner spec's chunk on s inputs per state (rows xs, state-major)."""
    rep = lambda v: jnp.repeat(v, s, axis=0)  # noqa: E731
    rs = Rows(xs, rep(rows.actions), None if rows.index is None else rep(rows.index), jax.tree.map(rep, rows.extra))
    shared = inner.shared(ctx, params, [ip], rs) if inner.shared is not None else None
    return inner.chunk(ctx, params, ip, rs, None, shared)


def _split_options(options, own):
    return {k: v for k, v in options.items() if k not in own}, {k: options[k] for k in own}


def _check_sigma(sigma):
    return check_positive_float("sigma", sigma, allow_zero=True, hint=" (a fraction of each state's value range)")


# ------------------------------------------------------------------ noise tunnel
def noise_tunnel(method, n: int = 50, sigma: float = 0.15, variant: str = "mean", *, name: str | None = None,
                 doc: str | None = None) -> Spec:
    """A method averaged over noisy copies x + N(0, s^2) of each state (SmoothGrad of any method).

    s = sigma * (max x - min x) per state. The returned spec runs with `jaxsal.explain(method=spec)`
    and takes options n_samples, sigma, variant (defaults from the arguments here), key,
    fast_prefix, first_index (the call's offset in a larger buffer) and the inner method's options.

    Args:
        method (str | Spec): a gradient or CAM method name (e.g. "gradcam") or spec.
        n (int): the default of option n_samples, noisy copies per state.
        sigma (float): the default of option sigma, the noise level as a fraction of each state's
            value range.
        variant (str): the default of option variant: "mean", "squared" (or "sg2", SmoothGrad^2)
            or "vargrad" (the variance).
        name (str | None): the spec's name; None: "noise_tunnel(<method>)".
        doc (str | None): the docstring of its method function; None: a one-line summary.

    Returns:
        Spec: the combined method.

    Raises:
        jaxsal.SaliencyInputError: `method` is no gradient or CAM method, is itself combined, or
            n, sigma or variant is invalid.
    """
    inner = _inner(method, "noise_tunnel")
    own = {"n_samples": check_positive_int("n", n), "sigma": _check_sigma(sigma), "variant": variant,
           "fast_prefix": True, "key": None, "first_index": 0}
    _variant(variant)
    sums, inner_finalize = inner.sums, inner.finalize
    tuned = inner._replace(prepare=None, options={}, example={}, doc="")  # what the traced pieces use

    def prepare(call, apply_fn, params, *, n_samples, sigma, variant, fast_prefix, key, first_index, **options):
        # first_index is read by the engine (Rows.index, jaxsal.engine.execute.first_index), not here
        key = as_key(key, name or f"noise_tunnel({inner.name})")
        n_samples = check_positive_int("n_samples", n_samples)
        sigma = _check_sigma(sigma)
        variant = _variant(variant)
        if "key" in inner.options:
            options["key"] = key
        ip, s, count = _inner_prepare(inner, call, apply_fn, params, options, n_samples)
        fast = sums is not None and inner.kind == "gradient"
        static = (ip.static, n_samples, s, sigma, variant, bool(fast_prefix), fast)
        return Prepared(static, (ip.arrays, key), ip.per_state, tuple(jnp.int32(g * s) for g in range(count)),
                        s * ip.rows_per_state)

    def chunk(ctx, params, prep, rows, offset, shared):
        ist, n_samples, s, sigma, variant, fast_prefix, fast = prep.static
        iarr, k = prep.arrays
        ip = Prepared(ist, iarr)
        x = rows.x
        j = offset + jnp.arange(s, dtype=jnp.int32)
        valid = (j < n_samples).astype(x.dtype)
        rng = x.reshape(x.shape[0], -1)
        scale = sigma * (rng.max(1) - rng.min(1))
        # drawn in NHWC order: the same noise for either layout; the shape comes from the traced chunk
        hwc = x.shape[1:] if ctx.layout == "NHWC" else (x.shape[2], x.shape[3], x.shape[1])

        def draw(kk):
            e = jax.random.normal(kk, hwc, x.dtype)
            return e if ctx.layout == "NHWC" else jnp.transpose(e, (2, 0, 1))

        def noise(i):
            ki = jax.random.fold_in(k, i)
            return jax.vmap(lambda jj: draw(jax.random.fold_in(ki, jj)))(j)
        eps = jax.vmap(noise)(rows.index) * scale.reshape((-1, 1) + (1,) * (x.ndim - 1))
        xn = (x[:, None] + eps).reshape((-1,) + x.shape[1:])
        squares = variant != "mean"
        if fast:
            s1, s2 = sums.samples(ctx, params, ip, x, xn, valid, rows.actions, squares, fast_prefix)
        else:
            g = _expanded_parts(tuned, ctx, params, ip, rows, xn, s)
            s1, s2 = _per_state_sum(g, valid, x.shape[0]), (_per_state_sum(g * g, valid, x.shape[0])
                                                            if squares else None)
        return s1, (s2 if squares else jnp.zeros((), s1.dtype))

    def finalize(ctx, params, prep, rows, acc):
        ist, n_samples, _, _, variant, _, _ = prep.static
        s1, s2 = acc
        mean = s1 / n_samples
        out = mean if variant == "mean" else s2 / n_samples if variant == "squared" else s2 / n_samples - mean * mean
        return inner_finalize(ctx, params, Prepared(ist, prep.arrays[0]), rows, out)

    return Spec(name or f"noise_tunnel({inner.name})", prepare, chunk, finalize,
                options={**inner.options, **own}, example={**inner.example, "n_samples": 4}, stochastic=True,
                kind="combined", indexed=True, doc=doc or f"{inner.name} averaged over noisy copies of each state "
                                            "(jaxsal.engine.noise_tunnel).")


def _variant(variant):
    if variant not in VARIANT_NAMES:
        raise SaliencyInputError(f"variant must be one of {VARIANTS} ('sg2' = 'squared'), got {variant!r}")
    return VARIANT_NAMES[variant]


# ------------------------------------------------------------------ path integral
def quadrature(steps: int, rule: str = "riemann_right"):
    """Path points alpha in [0, 1] and weights (summing to 1) for `steps` steps."""
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
        raise SaliencyInputError(f"the quadrature (method=) must be one of {QUADRATURES}, got {rule!r}")
    return a.astype(np.float32), w.astype(np.float32)


def blur(x, sigma, layout):
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


def _check_baseline(baseline):
    if isinstance(baseline, str) and baseline not in BASELINES:
        raise SaliencyInputError(f"baseline must be one of {BASELINES} or an array, got {baseline!r}")


def _baseline(call, baseline, blur_sigma, key, what):
    """(kind, call-wide array, per-state arrays, uniform key) of a baseline option."""
    x = call.x
    n = x.shape[0]
    ukey = jnp.zeros((2,), jnp.uint32)
    if isinstance(baseline, str):
        _check_baseline(baseline)
        if baseline == "blur":
            check_positive_float("blur_sigma", blur_sigma, hint=" (pixels)")
        if baseline == "uniform":
            ukey = as_key(key, f"{what} (baseline='uniform')")
        return baseline, jnp.zeros((), jnp.float32), {}, ukey
    b = np.shape(baseline)
    try:
        ok = len(b) <= x.ndim and np.broadcast_shapes(b, x.shape) == tuple(x.shape)
    except ValueError:
        ok = False
    if not ok:
        raise SaliencyInputError(f"baseline array of shape {b} does not broadcast to obs shape {tuple(x.shape)} "
                                 "(same layout as obs)")
    arr = jnp.asarray(baseline, jnp.float32)
    if not batching.is_traced(arr) and not bool(jnp.isfinite(arr).all()):
        raise SaliencyInputError("baseline contains NaN or inf values")
    if len(b) == x.ndim and b[0] == n and n > 1:
        return "per_state", jnp.zeros((), jnp.float32), {"baseline": jnp.broadcast_to(arr, x.shape)}, ukey
    const = jnp.broadcast_to(arr.reshape(b[1:] if len(b) == x.ndim else b), x.shape[1:])
    return "const", const, {}, ukey


def _x0(kind, bsig, layout, x, rows, const, k):
    if kind == "black":
        return jnp.zeros_like(x)
    if kind == "blur":
        return blur(x, bsig, layout)
    if kind == "uniform":
        flat = x.reshape(x.shape[0], -1)
        lo, hi = flat.min(1), flat.max(1)
        u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(k, i), x.shape[1:]))(rows.index)
        shp = (-1,) + (1,) * (x.ndim - 1)
        return lo.reshape(shp) + u * (hi - lo).reshape(shp)
    if kind == "per_state":
        return rows.extra["baseline"]
    return jnp.broadcast_to(const, x.shape)


def path_integral(method, steps: int = 50, baseline="black", *, quadrature_option: str = "quadrature",
                  name: str | None = None, doc: str | None = None) -> Spec:
    """A method integrated along the straight path from a baseline to each state (IG of any method).

    For an input-gradient method the path sum is multiplied by (x - x0): Integrated Gradients of
    that gradient; for any other method it is the path average of its maps. The returned spec
    runs with `jaxsal.explain(method=spec)` and takes options steps, baseline (defaults from the
    arguments here), quadrature (default right Riemann), blur_sigma (baseline "blur"),
    return_error (input-gradient methods: also the completeness error per state), fast_prefix,
    key and first_index (baseline "uniform") and the inner method's options.

    Args:
        method (str | Spec): a gradient or CAM method name (e.g. "guided_backprop") or spec.
        steps (int): the default of option steps, quadrature points along the path.
        baseline (str | jax.Array): the default of option baseline: "black" (zeros), "blur",
            "uniform" (U(min x, max x) per state) or an array broadcastable to obs.
        quadrature_option (str): the name under which the spec takes its quadrature rule.
        name (str | None): the spec's name; None: "path_integral(<method>)".
        doc (str | None): the docstring of its method function; None: a one-line summary.

    Returns:
        Spec: the combined method.

    Raises:
        jaxsal.SaliencyInputError: `method` is no gradient or CAM method, is itself combined,
            steps is not a positive integer, or baseline is an unknown name.
    """
    inner = _inner(method, "path_integral")
    _check_baseline(baseline)  # a misspelt default fails here, not on the first call
    qname = quadrature_option
    own = {"steps": check_positive_int("steps", steps), "baseline": baseline, qname: "riemann_right",
           "blur_sigma": 5.0, "return_error": False, "fast_prefix": True, "key": None, "first_index": 0}
    sums, inner_finalize, gradient = inner.sums, inner.finalize, inner.kind == "gradient"
    tuned = inner._replace(prepare=None, options={}, example={}, doc="")
    what = name or f"path_integral({inner.name})"

    def prepare(call, apply_fn, params, **options):
        options, mine = _split_options(options, own)
        steps = check_positive_int("steps", mine["steps"])
        alphas, weights = quadrature(steps, mine[qname])
        if mine["return_error"] and not gradient:
            raise SaliencyInputError(f"return_error needs an input-gradient method, not {inner.name!r}")
        if "key" in inner.options:
            options["key"] = mine["key"]
        kind, const, per_state, ukey = _baseline(call, mine["baseline"], mine["blur_sigma"], mine["key"], what)
        ip, s, count = _inner_prepare(inner, call, apply_fn, params, options, steps)
        pad = s * count - steps
        alphas = np.concatenate([alphas, np.zeros(pad, np.float32)])
        weights = np.concatenate([weights, np.zeros(pad, np.float32)])
        groups = tuple((jnp.asarray(alphas[i * s:(i + 1) * s]), jnp.asarray(weights[i * s:(i + 1) * s]))
                       for i in range(count))
        bsig = float(mine["blur_sigma"]) if kind == "blur" else 0.0
        static = (ip.static, kind, bsig, bool(mine["return_error"]), bool(mine["fast_prefix"]),
                  sums is not None and gradient, s)
        return Prepared(static, (ip.arrays, const, ukey), {**ip.per_state, **per_state}, groups,
                        s * ip.rows_per_state)

    def chunk(ctx, params, prep, rows, group, shared):
        ist, kind, bsig, _, fast_prefix, fast, s = prep.static
        iarr, const, k = prep.arrays
        al, wt = group
        x = rows.x
        x0 = _x0(kind, bsig, ctx.layout, x, rows, const, k)
        if fast:
            return sums.path(ctx, params, Prepared(ist, iarr), x0, x, al, wt, rows.actions, fast_prefix)
        shp = (1, s) + (1,) * (x.ndim - 1)
        xs = (x0[:, None] + al.reshape(shp) * (x - x0)[:, None]).reshape((-1,) + x.shape[1:])
        return _per_state_sum(_expanded_parts(tuned, ctx, params, Prepared(ist, iarr), rows, xs, s), wt, x.shape[0])

    def finalize(ctx, params, prep, rows, avg):
        ist, kind, bsig, return_error, _, _, _ = prep.static
        iarr, const, k = prep.arrays
        ip = Prepared(ist, iarr)
        if not gradient:
            return inner_finalize(ctx, params, ip, rows, avg)
        x = rows.x
        x0 = _x0(kind, bsig, ctx.layout, x, rows, const, k)
        attr = (x - x0) * avg
        maps = inner_finalize(ctx, params, ip, rows, attr)
        if not return_error:
            return maps
        y = objective(ctx.target, ctx.apply_fn(params, x), rows.actions)
        y0 = objective(ctx.target, ctx.apply_fn(params, x0), rows.actions)
        return maps, attr.reshape(x.shape[0], -1).sum(1) - (y - y0)

    return Spec(what, prepare, chunk, finalize, options={**inner.options, **own},
                example={**inner.example, "steps": 4}, kind="combined", indexed=True,
                doc=doc or f"{inner.name} integrated along the path from a baseline (jaxsal.engine.path_integral).")

