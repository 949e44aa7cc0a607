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


def looks_channel_first(shape) -> bool:
    """True when a 4-D batch shape reads as (N, C, H, W): the last axis is larger than a
    spatial axis of the NHWC reading while axis 1 is the smallest of the three."""
    _, a, b, c = shape
    return c > min(a, b) and a < min(b, c)


def looks_channel_last(shape) -> bool:
    """True when a 4-D batch shape reads as (N, H, W, C) (axis 1 larger than the last axis)."""
    _, a, b, c = shape
    return a > c and b > c


def resolve_layout(shape, layout: str | None, declared: str | None = None) -> str:
    """The layout to use for obs of `shape`: the caller's, else the model's declared one, else
    NHWC. Unless the caller said it, frames whose shape contradicts it are an error naming
    `layout=`: a channel axis larger than a spatial axis means the axes are swapped."""
    if layout is not None:
        if layout not in LAYOUTS:
            raise SaliencyInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        return layout
    use = declared or "NHWC"
    if use not in LAYOUTS:
        raise SaliencyInputError(f"the model declares layout {use!r}; expected one of {LAYOUTS}")
    shape = tuple(shape)
    if len(shape) != 4:
        return use
    if use == "NHWC" and looks_channel_first(shape):
        raise SaliencyInputError(
            f"obs of shape {shape} looks channel-first (N, C, H, W) but the call is channel-last: pass "
            "layout='NCHW' for a channel-first model, or obs.transpose(0, 2, 3, 1) for a channel-last "
            "one (layout='NHWC' silences this check)")
    if use == "NCHW" and looks_channel_last(shape):
        raise SaliencyInputError(
            f"obs of shape {shape} looks channel-last (N, H, W, C) but this model takes channel-first "
            "frames: pass obs.transpose(0, 3, 1, 2), or layout='NHWC' if the model really takes NHWC")
    return use


PIXELS = ("uint8",)


def check_pixels(obs, pixels: str | None):
    """Frames for a model trained on uint8 pixels must be on the 0..255 scale: values outside
    it, or float frames already divided by 255, are an error naming the fix. No-op otherwise."""
    if pixels is None:
        return
    if pixels not in PIXELS:
        raise SaliencyInputError(f"unknown pixel convention {pixels!r}; expected one of {PIXELS}")
    dtype = np.dtype(obs.dtype) if hasattr(obs, "dtype") else np.asarray(obs).dtype
    if dtype == np.uint8 or dtype == np.bool_:
        return
    if isinstance(obs, jax.core.Tracer):
        return  # under the caller's jit/vmap there are no values to check (the dtype was)
    x = obs if isinstance(obs, (np.ndarray, jnp.ndarray)) else np.asarray(obs)
    xp = np if isinstance(x, np.ndarray) else jnp
    lo, hi = float(xp.min(x)), float(xp.max(x))
    if lo < 0 or hi > 255:
        raise SaliencyInputError(
            f"frames have values in [{lo:g}, {hi:g}] but this agent takes uint8 pixels 0..255: pass the raw "
            "frames (e.g. np.clip(obs, 0, 255).astype(np.uint8) if they were shifted or scaled)")
    if np.issubdtype(dtype, np.floating) and hi <= 1.0 and bool(xp.any(x != xp.round(x))):
        raise SaliencyInputError(
            "frames are floats in [0, 1] but this agent takes pixels on the 0..255 scale (it divides by "
            "255 itself): pass (obs * 255).round().astype(np.uint8)")
