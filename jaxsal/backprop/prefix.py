"""The affine prefix of any apply_fn: f = R o P with P(z) = L z + c, found on the traced jaxpr.

Methods that average input gradients over many inputs (Integrated Gradients, SmoothGrad and
their guided variants) can exploit the ops from the observation up to its first nonlinearity
(scaling by constants, dtype widening, reshapes/transposes, convolutions and matrix products
with weights that do not depend on the input, bias adds): they form an affine map P, so

- P of an interpolated input is the interpolation of P at the end points, and
- the backward through P is the linear map L^T, which commutes with averaging.

`split_affine(apply_fn, params, row_shape)` traces apply_fn on one row and classifies every
value of its (inlined) jaxpr as constant (independent of the observation), affine in the
observation, or neither; an op is affine only if it is one of the recognised linear
primitives applied the right way (e.g. `mul` with exactly one input-dependent operand). The
prefix is every affine value; its *frontier* is the set of affine values that a non-affine op
(or the output) consumes. P maps an observation to the frontier; R maps the frontier to the
output. Both are per-row functions vmapped over the batch, which assumes each output row depends
only on its own observation row, as jaxsal's chunking and bucket padding already do.

No split (None) when the prefix holds no convolution or matrix product (nothing to save), when
tracing fails, or when an output leaf has no leading batch axis.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.jaxprs import CALLS, bind_eqn, jcore

_LINEAR_ANY = frozenset({
    "neg", "reshape", "transpose", "squeeze", "expand_dims", "broadcast_in_dim", "reduce_sum",
    "copy", "copy_p", "rev", "slice", "pad", "concatenate", "add", "sub", "add_any", "cumsum",
})
"""Primitives affine in their inputs jointly, whatever mix of constant and affine operands."""

_BILINEAR = frozenset({"mul", "dot_general", "conv_general_dilated"})
"""Affine when exactly one operand depends on the observation."""

_COSTLY = frozenset({"dot_general", "conv_general_dilated"})
"""Prefix ops worth the split: without one of them the plain path is as fast."""

K, A, N = 0, 1, 2  # constant w.r.t. the observation, affine in it, neither


class _Eqn(NamedTuple):
    eqn: object      # the original jaxpr equation (primitive, params, context)
    ins: tuple       # refs: int value ids, or ("c", i) constants
    outs: tuple      # int value ids


class _Program(NamedTuple):
    """A flat (call-inlined) program: inputs are value ids 0..n_in-1 (params leaves, then x)."""
    n_in: int
    consts: list
    eqns: list
    outs: tuple      # refs of the outputs


def _flatten(closed, n_in) -> _Program:
    consts, eqns = [], []
    counter = [n_in]

    def new_id():
        counter[0] += 1
        return counter[0] - 1

    def const(val):
        consts.append(val)
        return ("c", len(consts) - 1)

    def walk(jaxpr, jconsts, in_refs):
        env = {}
        for v, c in zip(jaxpr.constvars, jconsts):
            env[v] = const(c)
        for v, r in zip(jaxpr.invars, in_refs):
            env[v] = r

        def read(v):
            return const(v.val) if isinstance(v, jcore.Literal) else env[v]

        for eqn in jaxpr.eqns:
            ins = tuple(read(v) for v in eqn.invars)
            sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")) \
                if eqn.primitive.name in CALLS else None
            if sub is not None:
                outs = walk(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), ins)
            else:
                outs = tuple(new_id() for _ in eqn.outvars)
                eqns.append(_Eqn(eqn, ins, outs))
            for v, r in zip(eqn.outvars, outs):
                env[v] = r
        return tuple(read(v) for v in jaxpr.outvars)

    outs = walk(closed.jaxpr, closed.consts, tuple(range(n_in)))
    return _Program(n_in, consts, eqns, outs)


def _kind_of_eqn(eqn, kinds) -> int:
    if all(k == K for k in kinds):
        return K
    if N in kinds:
        return N
    name = eqn.primitive.name
    if name in _LINEAR_ANY:
        return A
    if name in _BILINEAR:
        return A if sum(k == A for k in kinds) == 1 else N
    if name == "div":
        return A if kinds[1] == K else N
    if name == "convert_element_type":
        old, new = eqn.invars[0].aval.dtype, jnp.dtype(eqn.params["new_dtype"])
        ok = jnp.issubdtype(old, jnp.floating) and jnp.issubdtype(new, jnp.floating) \
            and jnp.finfo(new).bits >= jnp.finfo(old).bits
        return A if ok else N
    return N


def _classify(prog: _Program):
    """Kinds of every value id; the prefix eqn indices; the frontier value ids (ordered)."""
    kinds = {i: K for i in range(prog.n_in - 1)}
    kinds[prog.n_in - 1] = A

    def kind(r):
        return K if isinstance(r, tuple) else kinds[r]

    eq_kinds = []
    for e in prog.eqns:
        k = _kind_of_eqn(e.eqn, [kind(r) for r in e.ins])
        eq_kinds.append(k)
        for o in e.outs:
            kinds[o] = k
    frontier = {}
    for e, k in zip(prog.eqns, eq_kinds):
        if k == N:
            for r in e.ins:
                if kind(r) == A:
                    frontier[r] = None
    for r in prog.outs:
        if kind(r) == A:
            frontier[r] = None
    return kinds, eq_kinds, tuple(frontier)


def _run(prog: _Program, env: dict, keep: set, eq_kinds, want):
    """Evaluate the eqns whose kind is in `keep` on top of env; return the values of `want`."""
    def read(r):
        return prog.consts[r[1]] if isinstance(r, tuple) else env[r]

    for e, k in zip(prog.eqns, eq_kinds):
        if k in keep:
            for o, val in zip(e.outs, bind_eqn(e.eqn, [read(r) for r in e.ins])):
                env[o] = val
    return [read(r) for r in want]


class AffineSplit(NamedTuple):
    """apply_fn(params, x) == rest(params, prefix(params, x)) for a batch x, prefix affine in x."""
    prefix: Callable          # (params, x (B, *row)) -> tuple of (B, *shape) frontier arrays
    rest: Callable            # (params, tuple of (B, *shape)) -> apply_fn's output pytree
    frontier: tuple           # shapes of the frontier arrays for one row (batch axis 1)
    n_affine: int             # affine ops in the prefix
    costly: int               # convolutions / matrix products among them


def split_affine(apply_fn, params, row_shape, dtype=jnp.float32) -> AffineSplit | None:
    """Split apply_fn at the end of its affine prefix w.r.t. the observation (see module doc).

    row_shape: one observation's shape (no batch axis). params may be arrays or tracers (only
    their shapes are traced). Returns None when there is no useful prefix.
    """
    row_shape = tuple(int(d) for d in row_shape)
    p_abs = jax.tree.map(lambda l: jax.ShapeDtypeStruct(np.shape(l), jnp.result_type(l)), params)
    x_abs = jax.ShapeDtypeStruct((1,) + row_shape, dtype)
    try:
        closed, out1 = jax.make_jaxpr(apply_fn, return_shape=True)(p_abs, x_abs)
        # through a call: a copied jax.jit function (SBX's, after load) lacks what eval_shape(fn) reads
        out2 = jax.eval_shape(lambda p, o: apply_fn(p, o), p_abs, jax.ShapeDtypeStruct((2,) + row_shape, dtype))
    except Exception:  # noqa: BLE001 (the plain path reports the model's own error)
        return None
    l1, l2 = jax.tree.leaves(out1), jax.tree.leaves(out2)
    if jax.tree.structure(out1) != jax.tree.structure(out2) or any(
            len(a.shape) == 0 or a.shape[0] != 1 or b.shape != (2,) + a.shape[1:]
            for a, b in zip(l1, l2)):
        return None
    n_in = len(jax.tree.leaves(params)) + 1
    if len(closed.jaxpr.invars) != n_in:
        return None
    prog = _flatten(closed, n_in)
    kinds, eq_kinds, frontier = _classify(prog)
    costly = sum(k == A and e.eqn.primitive.name in _COSTLY
                 for e, k in zip(prog.eqns, eq_kinds))
    if not costly or not frontier:
        return None
    shapes = {}
    for e in prog.eqns:
        for v, o in zip(e.eqn.outvars, e.outs):
            shapes[o] = tuple(v.aval.shape)
    shapes[n_in - 1] = (1,) + row_shape
    out_tree = jax.tree.structure(out1)

    def prefix_row(leaves, x_row):
        env = dict(enumerate(leaves))
        env[n_in - 1] = x_row[None]
        return tuple(_run(prog, env, {K, A}, eq_kinds, frontier))

    def rest_row(leaves, u_row):
        env = dict(enumerate(leaves))
        env.update(zip(frontier, u_row))
        outs = _run(prog, env, {K, N}, eq_kinds, prog.outs)
        return [jnp.reshape(o, np.shape(o)[1:]) for o in outs]

    def prefix(params_, x):
        leaves = jax.tree.leaves(params_)
        return jax.vmap(prefix_row, (None, 0))(leaves, x)

    def rest(params_, u):
        leaves = jax.tree.leaves(params_)
        outs = jax.vmap(rest_row, (None, 0))(leaves, tuple(u))
        return jax.tree.unflatten(out_tree, outs)

    return AffineSplit(prefix, rest, tuple(shapes[f] for f in frontier),
                       sum(k == A for k in eq_kinds), costly)
