"""Shared plumbing of the gradient methods: input checks, target objective, chunked execution.

Every method validates once on the host (obs, layout, target, actions, key), then runs a
cached jitted function per chunk of states in a Python loop (not lax.map: XLA:CPU conv
gradients in loops are ~10x slower), padding the last chunk and sharding each chunk's
batch axis over the local devices. Results stay on device.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching
from jaxsal.errors import SaliencyInputError
from jaxsal.targets import check_actions, get_target, logits_of, q_of
from jaxsal.validate import check_obs, check_positive_int, spatial_shape, to_nhwc



class Prepared(NamedTuple):
    """Validated inputs of one method call."""
    x: jax.Array            # float32 observations, in the caller's layout
    target: object          # jaxsal.targets.Target
    target_key: object      # hashable cache key of the caller's target (name or callable)
    actions: jax.Array | None  # (N,) int32 user actions, or None: chosen per sample
    hwc: tuple              # (H, W, C)
    layout: str
    rows: int               # model rows per compiled call


def _probe(apply_fn, params, x1, layout):
    try:
        return jax.eval_shape(apply_fn, params, x1)
    except SaliencyInputError:
        raise
    except Exception as e:  # noqa: BLE001 (turned into one clear error)
        raise SaliencyInputError(
            f"apply_fn(params, obs) failed on obs of shape {tuple(x1.shape[1:])} per state with "
            f"layout={layout!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
            "Check the observation shape and layout (use layout='NCHW' for channel-first models) "
            "and that params belong to this apply_fn.") from None


def params_signature(params) -> tuple:
    """Hashable tree structure + leaf shapes/dtypes: what traced shapes depend on in params."""
    return (jax.tree.structure(params),
            tuple((np.shape(l), str(getattr(l, "dtype", type(l)))) for l in jax.tree.leaves(params)))


_SHAPES: dict = {}  # (apply_fn, target, params/obs shapes) -> output shapes of a checked call


def _checked_output(apply_fn, params, x, layout, tgt, target_key):
    """Output shapes of apply_fn on one state, with the target checked to give one scalar per
    state. Memoised on the function, target and shapes (tracing twice per call cost ~1.3 ms, most
    of a one-state gradient call); failures are never cached."""
    try:
        key = (apply_fn, target_key, layout, tuple(x.shape[1:]), params_signature(params))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _SHAPES:
        return _SHAPES[key]
    out = _probe(apply_fn, params, jax.ShapeDtypeStruct((1,) + tuple(x.shape[1:]), jnp.float32),
                 layout)
    try:
        score = jax.eval_shape(lambda o: tgt.score(o, tgt.choose(o)), out)
    except SaliencyInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise SaliencyInputError(f"target {tgt.name!r} cannot be computed from this model's "
                                 f"output ({jax.tree.map(lambda s: s.shape, out)}): {e}") from None
    if getattr(score, "shape", None) != (1,):
        raise SaliencyInputError(f"target {tgt.name!r} must give one scalar per sample, shape "
                                 f"(N,); got {getattr(score, 'shape', type(score))} for N = 1")
    if key is not None:
        if len(_SHAPES) > 256:
            _SHAPES.clear()
        _SHAPES[key] = out
    return out


def _num_actions(out):
    for getter in (q_of, logits_of):
        try:
            a = getter(out)
            if hasattr(a, "shape") and len(a.shape) == 2:
                return int(a.shape[-1])
        except SaliencyInputError:
            pass
    return None


def as_float(x):
    """float32 view of a chunk of observations (integer frames are cast per chunk, on device)."""
    return jnp.asarray(x).astype(jnp.float32)


def _check_obs_lazy(obs, layout):
    """Validate obs; float input -> float32 array, integer/bool input kept as is (cast per chunk,
    so 100k uint8 frames never exist as one float32 copy)."""
    if np.ndim(obs) != 4 or not isinstance(obs, (np.ndarray, jax.Array, jax.core.Tracer)):
        return check_obs(obs, layout)
    dtype = np.dtype(obs.dtype)
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        check_obs(obs[:1], layout)
        return obs
    return check_obs(obs, layout)


def prepare(apply_fn, params, obs, *, target, actions, layout, batch_size) -> Prepared:
    """Validate a call; raise SaliencyInputError naming the problem and the fix."""
    if not callable(apply_fn):
        raise SaliencyInputError(f"apply_fn must be callable as apply_fn(params, obs), got "
                                 f"{type(apply_fn).__name__}")
    x = _check_obs_lazy(obs, layout)
    if batch_size is not None:
        check_positive_int("batch_size", batch_size)
    tgt = get_target(target)
    key = target if isinstance(target, str) else ("callable", target)
    out = _checked_output(apply_fn, params, x, layout, tgt, key)
    n = x.shape[0]
    if actions is not None:
        actions = jnp.asarray(check_actions(actions, n, _num_actions(out)))
    elif tgt.name == "q_action":
        raise SaliencyInputError("target='q_action' needs actions=(N,) integer actions")
    rows = batching.default_rows() if batch_size is None else int(batch_size)
    return Prepared(x, tgt, key, actions, spatial_shape(x.shape, layout), layout, rows)


def objective(tgt, out, actions):
    """Per-sample target scores (N,); actions None -> the target's choice on this output."""
    if actions is None:
        actions = tgt.choose(jax.tree.map(jax.lax.stop_gradient, out))
    return tgt.score(out, jax.lax.stop_gradient(actions).astype(jnp.int32))


def choose_actions(apply_fn, params, prep: Prepared):
    """Actions fixed once from the clean forward pass (for methods that perturb the input)."""
    if prep.actions is not None:
        return prep.actions
    tgt = prep.target
    fn = batching.cached_jit(("choose", apply_fn, prep.target_key),
                             lambda: lambda p, x: tgt.choose(apply_fn(p, as_float(x))).astype(
                                 jnp.int32))
    return batching.map_batched(fn, params, prep.x, batch_size=prep.rows)


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
    return jnp.arange(n, dtype=jnp.int32)


def as_key(key, method):
    """Check and normalise a PRNG key (typed or raw uint32[2])."""
    from jaxsal.validate import check_key
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
