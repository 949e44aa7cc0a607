"""The checks of every call, in one module: shape, layout, dtype, values, model, target, actions.

`check_call` validates one method call on shapes (jax.eval_shape), so that it runs unchanged
under the caller's jit/vmap/scan; value checks (NaN, the pixel scale of agents that declare
uint8 pixels) run only where values exist, once per batch of frames. Every entry point goes
through it: `jaxsal.explain`, a method function called directly (`jaxsal.gradcam(...)`), the
batch job and the CLI (which turns these errors into its one-line messages). Each failure is
one SaliencyInputError naming the fix.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import caching, sizing
from jaxsal.errors import SaliencyInputError, brief
from jaxsal.targets import INT32_MAX, check_actions, get_target, greedy, logits_of, q_of, require_actions

LAYOUTS = ("NHWC", "NCHW")


def check_obs(obs, layout: str = "NHWC"):
    """Validate a batch of observations; returns it as a float32 jax array (values unchanged).

    Gradients are taken with respect to this float value of the observation as given.
    """
    dtype = _check_obs_form(obs, layout)
    x = jnp.asarray(obs, jnp.float32)
    traced = isinstance(x, jax.core.Tracer)  # under jit/vmap: no values to check (see README)
    if np.issubdtype(dtype, np.floating) and not traced and not _VALUES_CHECKED.get():
        check_finite(x)
    return x


def _check_obs_form(obs, layout):
    """check_obs's checks of the layout, shape and dtype (no values read); returns the dtype."""
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
    return dtype


class NonFinite(SaliencyInputError):
    """Frames holding NaN or inf; `index` is the first such state (counted from the start)."""

    def __init__(self, msg: str, index: int):
        super().__init__(msg)
        self.index = index


def check_finite(x, start: int = 0, what: str = ("state", "obs")):
    """NaN or inf in float frames x (host or device; one reduction, the index only on failure)
    is an error naming the first bad state, numbered from `start`."""
    xp = np if isinstance(x, np.ndarray) else jnp
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return
    x = x.astype(np.float32, copy=False) if xp is np else x.astype(jnp.float32)  # as methods see them
    ok = xp.isfinite(x).all()
    if isinstance(ok, jax.core.Tracer) or bool(ok):  # inside a trace (frames closed over by a jitted
        return                                       # caller that checked them) values are unknown
    k = start + int(np.flatnonzero(~np.asarray(xp.isfinite(x.reshape(len(x), -1)).all(1)))[0])
    unit, name = what
    raise NonFinite(f"{unit} {k} of {name} holds NaN or inf values: replace them (e.g. "
                    f"np.nan_to_num(obs)) or drop those {unit}s", k)


_VALUES_CHECKED = contextvars.ContextVar("jaxsal_values_checked", default=False)


@contextlib.contextmanager
def values_checked():
    """Inside: the caller has checked the frames' values (NaN, pixel scale) already, once for all
    the methods it runs on them (a list of methods, every chunk of a batch job), so check_call
    checks shapes only: no second pass over the frames and no device sync per method."""
    token = _VALUES_CHECKED.set(True)
    try:
        yield
    finally:
        _VALUES_CHECKED.reset(token)


def check_values(x, pixels: str | None, start: int = 0, what=("state", "obs")):
    """The value checks of frames x, once: finite (float frames), on the agent's pixel scale."""
    if isinstance(x, jax.core.Tracer) or _VALUES_CHECKED.get():
        return
    x = x if hasattr(x, "dtype") else np.asarray(x)
    if np.ndim(x) != 4:
        return  # not a batch of frames: check_call's shape check says so
    check_finite(x, start, what)
    check_pixels(x, pixels)


def spatial_shape(obs_shape, layout: str):
    """(H, W, C) of an observation batch shape in the given layout."""
    if layout == "NHWC":
        return tuple(obs_shape[1:4])
    return (obs_shape[2], obs_shape[3], obs_shape[1])


def to_nhwc(x, layout: str):
    """Move an input-shaped attribution to NHWC (N, H, W, C)."""
    return x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))


def check_positive_int(name: str, value, minimum: int = 1):
    """A count or size: an integer >= minimum that fits int32 (jax's counts, shapes and indices are int32;
    a larger one failed deep inside a method, OverflowError or a MemoryError of terabytes)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise SaliencyInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > INT32_MAX:
        raise SaliencyInputError(f"{name} must be at most 2**31-1 = {INT32_MAX}, got {value!r}")
    return int(value)


def check_seed(name: str, value) -> int:
    """A PRNG seed jax.random.PRNGKey takes: an integer of 64 bits (a larger one was an OverflowError inside
    the job, after its manifest was written)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -2 ** 63 <= value < 2 ** 63:
        raise SaliencyInputError(f"{name} must be an integer from -2**63 to 2**63-1 (a 64-bit PRNG seed), got "
                                 f"{value!r}; give a seed in that range")
    return int(value)


def check_positive_float(name: str, value, allow_zero: bool = False, hint: str = "") -> float:
    """A finite real number > 0 (>= 0 with allow_zero), as a float; `hint` says what it measures."""
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) \
        and np.isfinite(float(value)) and (float(value) >= 0 if allow_zero else float(value) > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise SaliencyInputError(f"{name} must be a finite number {bound}{hint}, got {value!r}")
    return float(value)


def check_key(key, method: str):
    if key is None:
        raise SaliencyInputError(
            f"method {method!r} is stochastic: pass key=jax.random.PRNGKey(seed) (same key -> same maps)")
    return key


def as_key(key, method: str):
    """Check and normalise a PRNG key (typed or raw uint32[2]) of a stochastic method."""
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
    if pixels is None or _VALUES_CHECKED.get():
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


class Call(NamedTuple):
    """Validated inputs of one method call."""
    x: jax.Array            # observations in the caller's layout: float32, or integer (cast per chunk)
    target: object          # jaxsal.targets.Target
    target_key: object      # hashable cache key of the caller's target (name or callable)
    actions: jax.Array | None  # (N,) int32 user actions, or None: chosen per sample
    hwc: tuple              # (H, W, C)
    layout: str
    rows: int               # model rows per compiled call
    params_sig: tuple       # params_signature(params), computed once per call for every cache key that needs it
    batch_size: int | None = None  # the caller's batch_size (None: each method's default rows)


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
    rows = sizing.rows(batch_size)
    tgt = get_target(target)
    key = target if isinstance(target, str) else ("callable", target)
    sig = params_signature(params)
    out = check_model(apply_fn, params, x.shape, layout=layout, target=target, sig=sig)
    actions = target_actions(tgt, actions, x.shape[0], num_actions(out))
    return Call(x, tgt, key, None if actions is None else jnp.asarray(actions),
                spatial_shape(x.shape, layout), layout, rows, sig, sizing.check_batch_size(batch_size))


def as_float(x):
    """float32 view of a chunk of observations (integer frames are cast per chunk, on device)."""
    return jnp.asarray(x).astype(jnp.float32)


def params_signature(params) -> tuple:
    """Hashable tree structure + leaf shapes/dtypes: what traced shapes depend on in params. A walk
    over every leaf, so a call computes it once (Call.params_sig) and hands it to each cache key."""
    return (jax.tree.structure(params),
            tuple((np.shape(l), str(getattr(l, "dtype", type(l)))) for l in jax.tree.leaves(params)))


def named_leaves(tree, refuse=None) -> dict:
    """The leaves of a parameter tree by name (jax's path, e.g. "['params']['Dense_0']['kernel']"), in tree order.

    jax sorts a dict's names to flatten it, so a tree whose names do not sort (of mixed types, e.g. str and bytes,
    as a crafted checkpoint holds) cannot be read: `refuse(e)` makes the error raised then from jax's TypeError or
    ValueError `e` (None: `e` itself).
    """
    try:
        return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}
    except (TypeError, ValueError) as e:
        if refuse is None:
            raise
        raise refuse(e) from None


def first_nonfinite_leaf(leaves) -> str | None:
    """The name of the first floating-point leaf of `leaves` ((name, leaf) pairs, e.g. named_leaves(params).items())
    that holds NaN or inf, or a value beyond float32's range (JAX computes in float32: 1e300 in a float64 file is
    inf there); None when there is none. Leaves without a dtype, of other dtypes, or that numpy cannot read (a
    torch tensor's dtype) are passed over: the callers' checks of the model name them. A jax array is checked on
    its device (only the answer is copied), any other leaf with numpy."""
    for name, v in leaves:
        dtype = getattr(v, "dtype", None)
        try:
            if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
                continue
            if isinstance(v, jax.Array):
                finite = bool(jnp.isfinite(v.astype(jnp.float32)).all())
            else:
                with np.errstate(over="ignore"):
                    finite = bool(np.isfinite(np.asarray(v, np.float32)).all())
        except (TypeError, ValueError):
            continue
        if not finite:
            return name
    return None


def _check_obs_lazy(obs, layout):
    """Validate obs; float input -> float32 array, integer/bool input kept as is (cast per chunk,
    so 100k uint8 frames never exist as one float32 copy)."""
    if np.ndim(obs) != 4 or not isinstance(obs, (np.ndarray, jax.Array, jax.core.Tracer)):
        return check_obs(obs, layout)
    dtype = np.dtype(obs.dtype)
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        _check_obs_form(obs, layout)  # no values to check: no float copy, no device program per call
        return obs
    return check_obs(obs, layout)


KINDS = {"NHWC": "channel-last", "NCHW": "channel-first"}


class ModelFails(SaliencyInputError):
    """apply_fn fails on one state of the given shape; `layout` is the other layout when the model
    runs on frames read that way (the frames' axes are swapped), else None; `error` the failure."""

    def __init__(self, msg: str, shape: tuple, layout: str | None, alt_shape: tuple | None, error: str):
        super().__init__(msg)
        self.shape, self.layout, self.alt_shape, self.error = shape, layout, alt_shape, error


class TargetFails(SaliencyInputError):
    """The target cannot be computed from this model's output (e.g. value on a Q-network)."""


class ActionsDisagree(SaliencyInputError):
    """The model outputs another action count than its agent declares (`apply_fn.jaxsal_num_actions`: a card's or
    FUNCTION()'s num_actions); `who` names the agent."""

    def __init__(self, declared: int, outputs: int, who: str = "the agent"):
        super().__init__(f"{who} declares {declared} actions but its model outputs {outputs}: correct its num_actions "
                         "(or its card's)")
        self.declared, self.outputs = declared, outputs


def _check_declared_actions(apply_fn, out):
    """`out` (a model's output shapes), once it has the action count its apply_fn declares, if any: a declared count
    the model does not have would pass the actions, or a buffer of another game, checked against it."""
    declared, n = getattr(apply_fn, "jaxsal_num_actions", None), num_actions(out)
    if declared is not None and n is not None and n != declared:
        raise ActionsDisagree(declared, n)
    return out


def _other_reading(shape, layout):
    """One state's shape (1, ...) read in the other layout: NHWC (1, H, W, C) -> (1, C, H, W)."""
    if len(shape) != 4:
        return None
    return (1, shape[3], shape[1], shape[2]) if layout == "NHWC" else (1, shape[2], shape[3], shape[1])


def _probe(apply_fn, params, shape, layout):
    one = (1,) + tuple(shape[1:])
    try:  # through a plain function: eval_shape of a jitted function copied by a loader (SBX) failed
        return jax.eval_shape(lambda p, o: apply_fn(p, o), params, jax.ShapeDtypeStruct(one, jnp.float32))
    except SaliencyInputError:
        raise
    except Exception as e:  # noqa: BLE001 (turned into one clear error)
        err = brief(e)[:200]
    alt = _other_reading(one, layout)
    try:
        jax.eval_shape(lambda p, o: apply_fn(p, o), params, jax.ShapeDtypeStruct(alt, jnp.float32))
    except Exception:  # noqa: BLE001 (the other reading fails too: not a layout problem)
        raise ModelFails(
            f"apply_fn(params, obs) failed on obs of shape {one[1:]} per state with layout={layout!r}: "
            f"{err}. Check the observation shape and layout (use layout='NCHW' for channel-first "
            "models) and that params belong to this apply_fn.", one, None, None, err) from None
    other = "NCHW" if layout == "NHWC" else "NHWC"
    raise ModelFails(
        f"apply_fn takes {KINDS[other]} frames (N, {alt[1]}, {alt[2]}, {alt[3]}): pass layout={other!r} "
        f"(on {KINDS[layout]} frames {one} it fails: {err})", one, other, alt, err) from None


_SHAPES = caching.LRU("checked model outputs", 256)  # (apply_fn, target, params/obs shapes) -> output shapes of a checked call


def _shapes_key(apply_fn, target, layout, shape, sig):
    """Everything a probe's result depends on (the functions, layout, shapes, params' structure:
    `sig`, their params_signature), or None when some of it is unhashable (then nothing is memoised)."""
    try:
        key = (caching.fn_key(apply_fn), None if target is None else caching.fn_key(target), layout,
               tuple(shape[1:]), sig)
        hash(key)
    except TypeError:
        return None
    return key


def output_shape(apply_fn, params, shape, *, layout: str = "NHWC", sig: tuple | None = None):
    """The model's output shapes (a pytree of jax.ShapeDtypeStruct, batch 1) on one state of
    `shape` (N, ...) in `layout`: the one way jaxsal probes a model (no values computed). Memoised
    on the function and shapes (`sig`: params' params_signature where the caller has it); a model
    that fails is ModelFails, naming the layout when the other one runs."""
    key = _shapes_key(apply_fn, None, layout, shape, params_signature(params) if sig is None else sig)
    probe = lambda: _probe(apply_fn, params, shape, layout)  # noqa: E731
    return probe() if key is None else _SHAPES.get_or_build(key, probe)  # a failure raises: not cached


def check_model(apply_fn, params, shape, *, layout: str, target="q_chosen", sig: tuple | None = None):
    """Output shapes of apply_fn on one state of `shape` (N, ...) in `layout` (output_shape), with
    the target checked to give one scalar per state. Memoised on the function, target and shapes
    (tracing twice per call cost ~1.3 ms, most of a one-state gradient call); failures are never
    cached. A model that fails is ModelFails (naming the layout when the other one runs), a
    target it cannot give TargetFails, an action count other than its apply_fn declares
    ActionsDisagree. `sig`: params' params_signature where the caller has it."""
    tgt = get_target(target)
    sig = params_signature(params) if sig is None else sig
    key = _shapes_key(apply_fn, target, layout, shape, sig)
    check = lambda: _checked_target(tgt, _check_declared_actions(  # noqa: E731
        apply_fn, output_shape(apply_fn, params, shape, layout=layout, sig=sig)))
    return check() if key is None else _SHAPES.get_or_build(key, check)  # a failure raises: not cached


def _checked_target(tgt, out):
    """`out` (a model's output shapes), once the target gives one scalar per state from it."""
    try:
        score = jax.eval_shape(lambda o: tgt.score(o, greedy(tgt, o)), out)
    except Exception as e:  # noqa: BLE001
        if isinstance(e, SaliencyInputError):
            raise TargetFails(str(e)) from None
        raise TargetFails(f"target {tgt.name!r} cannot be computed from this model's "
                          f"output ({jax.tree.map(lambda s: s.shape, out)}): {e}") from None
    if getattr(score, "shape", None) != (1,):
        raise TargetFails(f"target {tgt.name!r} must give one scalar per sample, shape "
                          f"(N,); got {getattr(score, 'shape', type(score))} for N = 1")
    return out


def num_actions(out):
    """The action count of a model output (shapes): the last axis of its Q-vector or logits."""
    for getter in (q_of, logits_of):
        try:
            a = getter(out)
            if hasattr(a, "shape") and len(a.shape) == 2:
                return int(a.shape[-1])
        except SaliencyInputError:
            pass
    return None


def target_actions(target, actions, n: int, num_actions: int | None):
    """The caller's actions checked (check_actions), or None: the target chooses one per state
    from the clean output. target='q_action' has nothing to choose by: it needs actions."""
    if actions is not None:
        return check_actions(actions, n, num_actions)
    require_actions(target)
    return None
