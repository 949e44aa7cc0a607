"""Re-evaluating jaxprs: what every jaxpr rewrite of jaxsal shares (the backward rules of
jaxsal.backprop.rules, the affine-prefix split of jaxsal.backprop.prefix, the precision pass of
jaxsal.engine.precision): JAX's core module `jcore` (its `Literal`), the call primitives whose body is inlined, and
binding one equation again on new (concrete or traced) inputs."""
from __future__ import annotations

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
