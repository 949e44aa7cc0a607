"""One checked call: the validation every method (gradient or perturbation) runs first.

Checks apply_fn, obs, layout, batch_size, target and actions once, on shapes (jax.eval_shape),
so that it runs unchanged under the caller's jit/vmap/scan; value checks (NaN, the pixel scale
of agents that declare uint8 pixels) run only where values exist. Every entry point goes
through it: `jaxsal.explain`, a method function called directly (`jaxsal.gradcam(...)`) and the
batch job. Each failure is one SaliencyInputError naming the fix.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching
from jaxsal.errors import SaliencyInputError
from jaxsal.targets import check_actions, get_target, logits_of, q_of
from jaxsal.validate import (check_obs, check_pixels, check_positive_int, resolve_layout,
                             spatial_shape)


class Call(NamedTuple):
    """Validated inputs of one method call."""
    x: jax.Array            # observations in the caller's layout: float32, or integer (cast per chunk)
    target: object          # jaxsal.targets.Target
    target_key: object      # hashable cache key of the caller's target (name or callable)
    actions: jax.Array | None  # (N,) int32 user actions, or None: chosen per sample
    hwc: tuple              # (H, W, C)
    layout: str
    rows: int               # model rows per compiled call


def check_call(apply_fn, params, obs, *, target, actions, layout, batch_size) -> Call:
    """Validate a call; raise SaliencyInputError naming the problem and the fix. layout None:
    the model's declared layout (agents from jaxsal.loaders declare theirs), else NHWC, with
    frames whose shape contradicts it refused."""
    if not callable(apply_fn):
        raise SaliencyInputError(f"apply_fn must be callable as apply_fn(params, obs), got "
                                 f"{type(apply_fn).__name__}")
    layout = resolve_layout(np.shape(obs) if not hasattr(obs, "shape") else tuple(obs.shape), layout,
                            getattr(apply_fn, "jaxsal_layout", None))
    check_pixels(obs, getattr(apply_fn, "jaxsal_pixels", None))
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
    return Call(x, tgt, key, actions, spatial_shape(x.shape, layout), layout, rows)


def as_float(x):
    """float32 view of a chunk of observations (integer frames are cast per chunk, on device)."""
    return jnp.asarray(x).astype(jnp.float32)


def params_signature(params) -> tuple:
    """Hashable tree structure + leaf shapes/dtypes: what traced shapes depend on in params."""
    return (jax.tree.structure(params),
            tuple((np.shape(l), str(getattr(l, "dtype", type(l)))) for l in jax.tree.leaves(params)))


def _check_obs_lazy(obs, layout):
    """Validate obs; float input -> float32 array, integer/bool input kept as is (cast per chunk,
    so 100k uint8 frames never exist as one float32 copy)."""
    if np.ndim(obs) != 4 or not isinstance(obs, (np.ndarray, jax.Array, jax.core.Tracer)):
        return check_obs(obs, layout)
    dtype = np.dtype(obs.dtype)
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        check_obs(batching.head(obs), layout)
        return obs
    return check_obs(obs, layout)


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


_SHAPES = batching.LRU(256)  # (apply_fn, target, params/obs shapes) -> output shapes of a checked call


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
        _SHAPES.get_or_build(key, lambda: out)
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
