"""Input checks shared by every method: shape, layout, dtype, finiteness -> SaliencyInputError."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.errors import SaliencyInputError

LAYOUTS = ("NHWC", "NCHW")


def check_obs(obs, layout: str = "NHWC"):
    """Validate a batch of observations; returns it as a float32 jax array (values unchanged).

    Gradients are taken with respect to this float value of the observation as given.
    """
    if layout not in LAYOUTS:
        raise SaliencyInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    shape = tuple(np.shape(obs))
    if len(shape) != 4:
        hint = " Add a batch axis with obs[None] for a single state." if len(shape) == 3 else ""
        raise SaliencyInputError(
            f"obs must be a batch of frame stacks with shape (N, H, W, C) for layout='NHWC' "
            f"or (N, C, H, W) for layout='NCHW'; got shape {shape}.{hint}")
    if shape[0] == 0:
        raise SaliencyInputError("obs is empty (N = 0)")
    dtype = np.dtype(obs.dtype if hasattr(obs, "dtype") else np.asarray(obs).dtype)
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise SaliencyInputError(f"obs must be uint8, integer, bool or float, got dtype {dtype}")
    x = jnp.asarray(obs, jnp.float32)
    traced = isinstance(x, jax.core.Tracer)  # under jit/vmap: no values to check (see README)
    if np.issubdtype(dtype, np.floating) and not traced and not bool(jnp.isfinite(x).all()):
        raise SaliencyInputError("obs contains NaN or inf values; clean the input first")
    return x


def spatial_shape(obs_shape, layout: str):
    """(H, W, C) of an observation batch shape in the given layout."""
    if layout == "NHWC":
        return tuple(obs_shape[1:4])
    return (obs_shape[2], obs_shape[3], obs_shape[1])


def to_nhwc(x, layout: str):
    """Move an input-shaped attribution to NHWC (N, H, W, C)."""
    return x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))


def check_positive_int(name: str, value, minimum: int = 1):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise SaliencyInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_key(key, method: str):
    if key is None:
        raise SaliencyInputError(
            f"method {method!r} is stochastic: pass key=jax.random.PRNGKey(seed) (same key -> same maps)")
    return key
