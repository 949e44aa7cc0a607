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
from jaxsal.jaxprs import bind_eqn, transform

PRECISIONS = ("float32", "bfloat16")
LOWERED = ("conv_general_dilated", "dot_general")


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
    return transform(fn, lambda eqn: (lambda invals: _lowered(eqn, invals)) if _lowerable(eqn) else None)


def _lowerable(eqn) -> bool:
    """A float32 x float32 -> float32 conv or matmul that does not ask for Precision.HIGHEST."""
    if eqn.primitive.name not in LOWERED or any(v.aval.dtype != jnp.float32 for v in [*eqn.invars, *eqn.outvars]):
        return False
    p = eqn.params.get("precision")
    return not any(q == jax.lax.Precision.HIGHEST for q in (p if isinstance(p, tuple) else (p,)))


def _lowered(eqn, invals) -> list:
    lhs, rhs = (v.astype(jnp.bfloat16) for v in invals)
    return bind_eqn(eqn, [lhs, rhs], {"preferred_element_type": np.dtype(np.float32)})
