"""Shared plumbing of the gradient methods: target objective, fixed actions, chunked execution.

Every method validates once (jaxsal.checks.check_call, shared with the perturbation methods; the
key here), then runs a cached jitted function per chunk of states in a Python loop (not lax.map:
XLA:CPU conv gradients in loops are ~10x slower), padding the last chunk and sharding each
chunk's batch axis over the local devices. Results stay on device.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching
from jaxsal.checks import Call, as_float, to_nhwc
from jaxsal.errors import SaliencyInputError


def objective(tgt, out, actions):
    """Per-sample target scores (N,); actions None -> the target's choice on this output."""
    if actions is None:
        actions = tgt.choose(jax.tree.map(jax.lax.stop_gradient, out))
    return tgt.score(out, jax.lax.stop_gradient(actions).astype(jnp.int32))


def choose_actions(apply_fn, params, prep: Call):
    """Actions fixed once from the clean forward pass (for methods that perturb the input)."""
    if prep.actions is not None:
        return prep.actions
    fn = batching.cached_jit(_chooser, apply_fn, prep.target)
    return batching.map_batched(fn, params, prep.x, batch_size=prep.rows)


def _chooser(apply_fn, tgt):
    return lambda p, x: tgt.choose(apply_fn(p, as_float(x))).astype(jnp.int32)


def finish(attr, layout, per_frame):
    """Input-shaped attribution -> NHWC (N, H, W, C) if per_frame else summed over C (N, H, W)."""
    a = to_nhwc(attr, layout)
    return a if per_frame else a.sum(-1)


def run_chunks(fn, statics, arrays, rows_per_state: int, rows: int):
    """fn(statics, *chunk_arrays) over chunks of states (<= rows model rows); concat outputs."""
    size = batching.chunk_size(arrays[0].shape[0], max(1, rows // max(1, rows_per_state)), 1)
    return batching.run(lambda chunk: fn(statics, *chunk), list(arrays), size,
                        traced=batching.is_traced(statics, arrays))


def sample_groups(total: int, rows: int):
    """Split `total` samples/steps per state into groups of equal size s <= rows: (s, count)."""
    s = max(1, min(total, rows))
    return s, int(math.ceil(total / s))


def state_index(n: int):
    """0..n-1 as a host array: chunked and padded like the frames (jnp.arange would compile one
    program per new number of states)."""
    return np.arange(n, dtype=np.int32)


def as_key(key, method):
    """Check and normalise a PRNG key (typed or raw uint32[2])."""
    from jaxsal.checks import check_key
    key = check_key(key, method)
    try:
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            return key
        if tuple(np.shape(key)) != (2,) or np.dtype(key.dtype) != np.uint32:
            raise TypeError
        return jnp.asarray(key)
    except (TypeError, AttributeError):
        raise SaliencyInputError(
            f"key must be a JAX PRNG key such as jax.random.PRNGKey(0) or jax.random.key(0), "
            f"got {key!r}") from None


def check_per_frame(method: str, per_frame):
    if per_frame:
        raise SaliencyInputError(
            f"method {method!r} gives layer-resolution maps only; per_frame=True is for input-"
            "resolution methods (gradient, grad_x_input, smoothgrad, integrated_gradients, "
            "guided_backprop, deconvnet, guided_gradcam, g2gradcam)")
