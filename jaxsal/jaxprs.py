"""Re-evaluating jaxprs: what every jaxpr rewrite of jaxsal shares (the backward rules of
jaxsal.backprop.rules, the affine-prefix split of jaxsal.backprop.prefix, the precision pass of
jaxsal.engine.precision, the sanity check's ungrouped convolutions): JAX's core module `jcore` (its
`Literal`), the call primitives whose body is inlined, binding one equation again on new (concrete or
traced) inputs, and `transform`, which replaces chosen equations everywhere in a function."""
from __future__ import annotations

from typing import Callable

import jax

try:
    from jax.extend import core as jcore
    jcore.Literal  # noqa: B018 (older JAX lacks it here)
except (ImportError, AttributeError):  # pragma: no cover
    from jax import core as jcore

CALLS = ("pjit", "jit", "closed_call", "core_call")
"""Call primitives (a nested jit) whose body a rewrite evaluates in place."""


def bind_eqn(eqn, invals, params: dict | None = None) -> list:
    """Run one jaxpr equation on concrete or traced values, as a list of outputs; `params`
    replaces some of the equation's parameters (e.g. a rewritten body of a scan)."""
    bound = eqn.primitive.get_bind_params(eqn.params if params is None else {**eqn.params, **params})
    if isinstance(bound, tuple):  # older JAX: (subfuns, params)
        subfuns, bound = bound
        invals = [*subfuns, *invals]
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **bound)
    return outs if eqn.primitive.multiple_results else [outs]


INLINED = {**{c: "jaxpr" for c in CALLS}, "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr"}
"""Primitives whose body `transform` evaluates in place (the parameter that holds it)."""


def transform(fn: Callable, replace: Callable) -> Callable:
    """fn with every equation for which `replace(eqn)` gives a function `f(invals) -> outs` computed by
    it instead, in nested jits, remat and custom_jvp/custom_vjp bodies (evaluated in place) and in the
    bodies of scan, while and cond (rewritten, not unrolled). Takes and returns fn's pytrees.

    It applies to the function as traced: rewrite a function that takes its own gradients, not one
    differentiated later (custom derivative rules are evaluated away)."""
    def transformed(*args):
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args), replace)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return transformed


def _rewritten(closed, replace):
    """A closed jaxpr with the same signature whose body is rewritten."""
    args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: _eval(closed.jaxpr, closed.consts, a, replace))(*args)


def _bodies(eqn, replace) -> dict:
    """The parameters of eqn (scan, while, cond, ...) that hold closed jaxprs, rewritten."""
    out = {}
    for k, v in eqn.params.items():
        if isinstance(v, jcore.ClosedJaxpr):
            out[k] = _rewritten(v, replace)
        elif isinstance(v, tuple) and any(isinstance(b, jcore.ClosedJaxpr) for b in v) \
                and all(b is None or isinstance(b, jcore.ClosedJaxpr) for b in v):
            # branches (a tuple) or custom_linear_solve's jaxprs (a named tuple, some None)
            new = [None if b is None else _rewritten(b, replace) for b in v]
            out[k] = v._make(new) if hasattr(v, "_make") else tuple(new)
    return out


def _eval(jaxpr, consts, args, replace) -> list:
    env = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        fn = replace(eqn)
        if fn is not None:
            outs = fn(invals)
        elif name in INLINED and INLINED[name] in eqn.params:
            sub = eqn.params[INLINED[name]]
            body, sub_consts = (sub.jaxpr, sub.consts) if isinstance(sub, jcore.ClosedJaxpr) else (sub, ())
            outs = _eval(body, sub_consts, invals, replace)
        else:
            outs = bind_eqn(eqn, invals, _bodies(eqn, replace) or None)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]
