"""Precision of the traced computation: "float32" (the plain path, untouched) or "bfloat16".

`with_precision(fn, "bfloat16")` traces fn to a jaxpr and evaluates it again with every float32
`conv_general_dilated` and `dot_general` run on bfloat16 operands with float32 accumulation
(`preferred_element_type=float32`), so its outputs keep their float32 dtypes. Sub-jaxprs are
rewritten too: nested jits, remat and custom_jvp/custom_vjp bodies are evaluated in place, scan,
while and cond get rewritten bodies (no unrolling). A model that casts its input to float32
inside still computes in bfloat16. An op that asks for `Precision.HIGHEST` keeps float32.

The rewrite applies to the function as traced, after differentiation: rewrite a function that
takes its own gradients (the engine rewrites each chunk function, backward pass included), not
a function that is differentiated later (its custom derivative rules are evaluated away).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.errors import SaliencyInputError
from jaxsal.jaxprs import CALLS, bind_eqn, jcore

PRECISIONS = ("float32", "bfloat16")
LOWERED = ("conv_general_dilated", "dot_general")
_INLINED = {**{c: "jaxpr" for c in CALLS}, "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
            "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr"}
"""Primitives whose body is evaluated in place (the parameter that holds it)."""


def check_precision(precision) -> str:
    """`precision` if it is one of PRECISIONS, else a one-line error naming them."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise SaliencyInputError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    return precision


def with_precision(fn, precision: str):
    """fn with its float32 convolutions and matmuls computed at `precision`.

    Args:
        fn (Callable): a JAX function of positional pytree arguments.
        precision (str): "float32" (returns fn itself) or "bfloat16" (bfloat16 operands, float32
            accumulation and outputs).

    Returns:
        Callable: a function of the same arguments and outputs as fn; composes with jit and vmap.

    Raises:
        jaxsal.SaliencyInputError: `precision` is not "float32" or "bfloat16".
    """
    if check_precision(precision) == "float32":
        return fn

    def lowered(*args):
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return lowered


def _lowerable(eqn) -> bool:
    """A float32 x float32 -> float32 conv or matmul that does not ask for Precision.HIGHEST."""
    if eqn.primitive.name not in LOWERED or any(v.aval.dtype != jnp.float32 for v in [*eqn.invars, *eqn.outvars]):
        return False
    p = eqn.params.get("precision")
    return not any(q == jax.lax.Precision.HIGHEST for q in (p if isinstance(p, tuple) else (p,)))


def _lowered(eqn, invals) -> list:
    lhs, rhs = (v.astype(jnp.bfloat16) for v in invals)
    return bind_eqn(eqn, [lhs, rhs], {"preferred_element_type": np.dtype(np.float32)})


def _rewritten(closed):
    """A closed jaxpr with the same signature whose body is rewritten."""
    args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: _eval(closed.jaxpr, closed.consts, a))(*args)


def _bodies(eqn) -> dict:
    """The parameters of eqn (scan, while, cond, ...) that hold closed jaxprs, rewritten."""
    out = {}
    for k, v in eqn.params.items():
        if isinstance(v, jcore.ClosedJaxpr):
            out[k] = _rewritten(v)
        elif isinstance(v, tuple) and v and all(isinstance(b, jcore.ClosedJaxpr) for b in v):
            out[k] = tuple(_rewritten(b) for b in v)
    return out


def _eval(jaxpr, consts, args) -> list:
    env = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if _lowerable(eqn):
            outs = _lowered(eqn, invals)
        elif name in _INLINED and _INLINED[name] in eqn.params:
            sub = eqn.params[_INLINED[name]]
            body, sub_consts = (sub.jaxpr, sub.consts) if isinstance(sub, jcore.ClosedJaxpr) else (sub, ())
            outs = _eval(body, sub_consts, invals)
        else:
            bodies = _bodies(eqn)
            outs = bind_eqn(eqn, invals, bodies or None)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]
