"""A trace-time proof that a function is local in space: each output pixel depends only on the
input pixel at the same (row, y, x), the channels free.

The incremental forward pass (jaxsal.perturbation._incremental) recomputes a conv only inside the
window its input changed in. That is exact when whatever runs between two convs (activations, a
per-pixel LayerNorm, x / 255) is local; for such code, found here by walking its jaxpr, the pass
needs no run-time check that the change stayed inside the window. Anything not recognised (a
spatial mean, a residual from an earlier layer, an unknown primitive) is "not proven": the caller
keeps its run-time check, so a false "no" costs speed, never correctness.

A value's taint is None (independent of the inputs: parameters and literals), BAD (depends on
them in a way not known to be local), or a tuple naming, per axis, which of the input's axes
(0 rows, 1 y, 2 x) it runs along, or None for a free (channel-like) axis.
"""
from __future__ import annotations

from jax.extend import core as xcore

BAD = "bad"
ELEMENTWISE = frozenset("""
    abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type copy
    copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite
    le lgamma digamma log log1p logistic lt max min mul ne neg nextafter not or pow real
    reduce_precision rem round rsqrt select_n sign sin sinh sqrt square sub tan tanh xor
    """.split())
REDUCE = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())
SOURCES = frozenset("""iota rng_uniform rng_bit_generator axis_index random_bits random_seed random_wrap
    random_unwrap random_fold_in random_split threefry2x32""".split())
"""Primitives whose values may differ between batches of other sizes (positions, random draws):
never "independent"."""
CALLS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
CALL_PRIMITIVES = frozenset("""pjit jit closed_call core_call custom_jvp_call custom_vjp_call
    custom_vjp_call_jaxpr remat checkpoint remat2""".split())
"""Primitives whose body takes the equation's inputs as they are (no slicing, as scan's does)."""


def _spatial_ok(axes, shape, out_shape) -> bool:
    """A tainted operand keeps its rows and pixels where it enters an op of shape out_shape (a
    size-1 spatial axis broadcast over the image would spread one pixel everywhere)."""
    return len(axes) == len(out_shape) and all(
        a is None or shape[i] == out_shape[i] for i, a in enumerate(axes))


def _sub_jaxpr(eqn):
    if eqn.primitive.name not in CALL_PRIMITIVES:
        return None
    for name in CALLS:
        sub = eqn.params.get(name)
        if isinstance(sub, xcore.ClosedJaxpr):
            return sub.jaxpr
        if isinstance(sub, xcore.Jaxpr):
            return sub
    return None


def _eqn(eqn, ins):
    """Output taints of one equation from its inputs' taints."""
    outs = eqn.outvars
    if eqn.primitive.name in SOURCES:
        return [BAD] * len(outs)
    tainted = [t for t in ins if t is not None]
    if not tainted:
        return [None] * len(outs)
    if any(t is BAD for t in tainted):
        return [BAD] * len(outs)
    name = eqn.primitive.name
    shapes = [getattr(v.aval, "shape", ()) for v in eqn.invars]
    sub = _sub_jaxpr(eqn)
    if sub is not None and len(sub.invars) == len(ins) and len(sub.outvars) == len(outs) and all(
            getattr(a.aval, "shape", None) == getattr(b.aval, "shape", None) for a, b in zip(sub.invars, eqn.invars)):
        return taints(sub, ins)
    if name in ELEMENTWISE and len(outs) == 1:
        out_shape = outs[0].aval.shape
        if len(set(tainted)) == 1 and all(
                t is None or _spatial_ok(t, s, out_shape) for t, s in zip(ins, shapes)):
            return [tainted[0]]
        return [BAD]
    t, shape = ins[0], shapes[0]
    if len(tainted) != 1 or t is None or len(outs) != 1:
        return [BAD] * len(outs)
    if name == "transpose":
        return [tuple(t[p] for p in eqn.params["permutation"])]
    if name in REDUCE:
        axes = set(eqn.params["axes"])
        if any(t[a] is not None for a in axes):
            return [BAD]
        return [tuple(a for i, a in enumerate(t) if i not in axes)]
    if name == "squeeze":
        dims = {d % len(t) for d in eqn.params["dimensions"]}
        return [BAD] if any(t[d] is not None for d in dims) else [tuple(a for i, a in enumerate(t) if i not in dims)]
    if name == "broadcast_in_dim":
        out_shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
        new = [None] * len(out_shape)
        for i, d in enumerate(dims):
            if t[i] is not None and shape[i] != out_shape[d]:
                return [BAD]
            new[d] = t[i]
        return [tuple(new)]
    if name == "reshape" and eqn.params.get("dimensions") is None:
        return [_reshape(t, shape, eqn.params["new_sizes"])]
    return [BAD]


def _reshape(t, shape, new_shape):
    """A reshape that only adds or drops size-1 free axes keeps the mapping; anything else is BAD."""
    old = [(n, a) for n, a in zip(shape, t) if n != 1 or a is not None]
    if any(n == 1 and a is not None for n, a in old):
        return BAD
    kept = [n for n in new_shape if n != 1]
    if [n for n, _ in old] != kept:
        return BAD
    it = iter(a for _, a in old)
    return tuple(None if n == 1 else next(it) for n in new_shape)


def taints(jaxpr, in_taints):
    """The taints of a jaxpr's outputs given its inputs' (constvars are independent)."""
    env = {}

    def read(v):
        return None if isinstance(v, xcore.Literal) else env.get(v)

    for v, t in zip(jaxpr.invars, in_taints):
        env[v] = t
    for eqn in jaxpr.eqns:
        for v, t in zip(eqn.outvars, _eqn(eqn, [read(v) for v in eqn.invars])):
            env[v] = t
    return [read(v) for v in jaxpr.outvars]


def is_local(closed, in_taints) -> bool:
    """Whether every output of a ClosedJaxpr is local in the tainted inputs (or independent of
    all inputs) and laid out (rows, y, x, free), as a flax conv's NHWC input is."""
    return all(t is None or t == (0, 1, 2, None) for t in taints(closed.jaxpr, in_taints))

