"""Weighted sums of input gradients over many inputs per state (Integrated Gradients, SmoothGrad).

Two exact paths give the same sums up to float rounding:

- plain: every input row goes through the whole model forward and backward;
- affine prefix (`fast_prefix=True`, the default): with apply_fn = R o P split at the end of
  its affine prefix P(z) = L z + c (`jaxsal.backprop.prefix`), the gradient at z is
  L^T grad(R)(P(z)), so sum_k w_k grad f(z_k) = L^T sum_k w_k grad(R)(P(z_k)): one transposed
  prefix per state instead of one per row. For IG the forward prefix of the interpolated
  inputs is the interpolation of P at the two end points, P(x0 + a (x - x0)) = P(x0) +
  a (P(x) - P(x0)), so P runs on 2 rows per state instead of `steps`. For the Nature CNN the
  prefix is conv1 (~35% of the forward FLOPs).

The ReLU rules (guided, deconvnet) and the strided-conv gradient rule act on R and on P's
transpose exactly as on the whole model (ReLUs end the prefix). Models without a useful prefix
(first op nonlinear, no conv/matmul before it) take the plain path.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal.engine.spec import objective
from jaxsal.backprop.prefix import split_affine
from jaxsal.backprop.rules import rewrite


def _grads(fn, tgt, params, xs, actions, rule, fast_conv):
    """Input gradients of the summed target of fn(params, xs) (any pytree xs)."""
    def f(xx, p):
        return objective(tgt, fn(p, xx), actions).sum()
    return jax.grad(rewrite(f, rule, fast_conv))(xs, params)


def _per_state_sum(g, weights, n):
    """(n*s, ...) rows -> (n, ...) sum over each state's s rows weighted by weights (s,) or (n, s)."""
    s = weights.shape[-1]
    g = g.reshape((n, s) + g.shape[1:])
    w = jnp.broadcast_to(weights, (n, s)).reshape((n, s) + (1,) * (g.ndim - 2))
    return (g * w.astype(g.dtype)).sum(1)


def _split(apply_fn, params, x, fast_prefix):
    return split_affine(apply_fn, params, x.shape[1:], x.dtype) if fast_prefix else None


def _transposed_prefix(sp, params, x, fast_conv):
    """(P(x), v -> L^T v): the prefix at x and its transpose (the prefix's input gradient)."""
    pf = rewrite(lambda xx, p: sp.prefix(p, xx), "plain", fast_conv)
    u, pull = jax.vjp(lambda xx: pf(xx, params), x)
    return u, lambda v: pull(tuple(v))[0]


def interpolated_gradient(apply_fn, tgt, params, x0, x, alphas, weights, actions, *,
                          rule="plain", fast_conv=True, fast_prefix=True):
    """sum_k weights_k grad f(x0 + alphas_k (x - x0)) per state, shape of x.

    x0, x: (N, ...) float; alphas, weights: (s,); actions: (N,) the explained action per state.
    """
    n, s = x.shape[0], alphas.shape[0]
    an = jnp.repeat(actions, s)
    shp = (1, s) + (1,) * (x.ndim - 1)
    sp = _split(apply_fn, params, x, fast_prefix)
    if sp is None:
        xs = (x0[:, None] + alphas.reshape(shp) * (x - x0)[:, None]).reshape((-1,) + x.shape[1:])
        return _per_state_sum(_grads(apply_fn, tgt, params, xs, an, rule, fast_conv), weights, n)
    u1, transpose = _transposed_prefix(sp, params, x, fast_conv)
    u0 = sp.prefix(params, x0)

    def interp(a0, a1):
        ash = (1, s) + (1,) * (a0.ndim - 1)
        return (a0[:, None] + alphas.reshape(ash) * (a1 - a0)[:, None]).reshape((-1,) + a0.shape[1:])

    us = tuple(interp(a0, a1) for a0, a1 in zip(u0, u1))
    gu = _grads(sp.rest, tgt, params, us, an, rule, fast_conv)
    return transpose(_per_state_sum(g, weights, n) for g in gu)


def sample_gradient_sums(apply_fn, tgt, params, x, xs, weights, actions, *, squares=False,
                         rule="plain", fast_conv=True, fast_prefix=True):
    """(sum_k w_k g_k, sum_k w_k g_k^2 or None) per state over the gradients g_k at the s
    samples xs (N*s rows, state-major) of each state x (N, ...); weights (s,) or (N, s).

    The squares are not linear in the gradient, so squares=True takes the plain path.
    """
    n, s = x.shape[0], weights.shape[-1]
    an = jnp.repeat(actions, s)
    sp = None if squares else _split(apply_fn, params, x, fast_prefix)
    if sp is None:
        g = _grads(apply_fn, tgt, params, xs, an, rule, fast_conv)
        return (_per_state_sum(g, weights, n),
                _per_state_sum(g * g, weights, n) if squares else None)
    gu = _grads(sp.rest, tgt, params, sp.prefix(params, xs), an, rule, fast_conv)
    _, transpose = _transposed_prefix(sp, params, x, fast_conv)
    return transpose(_per_state_sum(g, weights, n) for g in gu), None
