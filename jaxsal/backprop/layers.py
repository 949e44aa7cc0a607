"""Layer taps by flax module name: capture a module's output A and get dY/dA, no model edits.

`flax.linen.intercept_methods` sees every module call inside any `apply_fn`; the named
module's output gets a zero perturbation `eps` added, so d(target)/d(eps) = dY/dA.
A `jax.jit`-wrapped apply (SBX jits `module.apply`; so may a user, anywhere inside apply_fn)
runs its Python only when it (re)traces, so the interceptor would see nothing on a cached
trace and leak tracers on a new one: `seeing_modules` runs apply_fn with jit disabled, which
inlines every jitted call into the caller's trace (same operations, one program).
Names are module paths ("conv3", CleanRL's "Conv_2", "trunk/conv1"), optionally prefixed
with the root module's class ("Network/Conv_2") to tell apart equal names of separate applies.
"""
from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.batching import is_traced
from jaxsal.errors import SaliencyInputError

ACTIVATIONS: dict[str, Callable] = {"relu": jax.nn.relu, "leaky_relu": jax.nn.leaky_relu,
                                    "elu": jax.nn.elu, "gelu": jax.nn.gelu}


class LayerCall(NamedTuple):
    """One module call seen in a forward pass: its path name, qualified name, class, output shape."""
    name: str
    qualified: str
    kind: str
    shape: tuple | None


def _names(module) -> tuple[str, str] | None:
    path = tuple(module.path) if module.scope is not None else ()
    if not path:
        return None
    root = module
    while isinstance(getattr(root, "parent", None), nn.Module):
        root = root.parent
    name = "/".join(str(p) for p in path)
    return name, f"{type(root).__name__}/{name}"


@contextlib.contextmanager
def seeing_modules(interceptor):
    """`nn.intercept_methods(interceptor)` that also sees flax module calls inside jax.jit-wrapped
    functions (module docstring): jit is disabled meanwhile, so they run inline."""
    with jax.disable_jit(), nn.intercept_methods(interceptor):
        yield


def _calls(apply_fn, params, x) -> list[LayerCall]:
    calls: list[LayerCall] = []

    def record(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name == "__call__":
            names = _names(context.module)
            if names is not None:
                shape = tuple(out.shape) if hasattr(out, "shape") else None
                calls.append(LayerCall(*names, type(context.module).__name__, shape))
        return out

    def run(p, x):
        with seeing_modules(record):
            return apply_fn(p, x)

    jax.eval_shape(run, params, x)
    return calls


def layer_calls(apply_fn, params, x) -> list[LayerCall]:
    """Every flax module call in `apply_fn(params, x)`, in order of completion: the names `layer=` takes.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, x)`.
        params (PyTree): the model's parameters.
        x (jax.Array): a batch of observations the model accepts.

    Returns:
        list[LayerCall]: one (name, qualified name, module class, output shape) per module call.
    """
    return _calls(apply_fn, params, x)


def _matches(call: LayerCall, layer: str) -> bool:
    return layer in (call.name, call.qualified)


def called_more_than_once(layer: str, times: int) -> SaliencyInputError:
    """The error for a layer that one forward pass calls several times (the same module applied
    twice), with the fix: a tapped layer must have one output per state."""
    return SaliencyInputError(
        f"layer {layer!r} is called {times} times in one forward pass of apply_fn (the same module applied "
        "more than once, e.g. the trunk once for the policy and once for the value): compute it once in "
        "apply_fn and pass its output to every head (h = trunk(x); return actor(h), critic(h)), or name a "
        "layer called once with layer=")


def _rows(c1: LayerCall, c2: LayerCall, n: int) -> int | None:
    """k when a call's output is spatial (L, h, w, K) with L = k*n at n states and 2k*n at 2n
    (k rows per state: k = 1 ordinary, k > 1 a time-distributed trunk), else None."""
    if c1.shape is None or c2.shape is None or len(c1.shape) != 4 or len(c2.shape) != 4:
        return None
    lead = c1.shape[0]
    if lead < n or lead % n or c2.shape[0] != 2 * lead:
        return None
    return lead // n


def _resolve(apply_fn, params, x, layer):
    """(name, k): the layer to tap and its rows per state (see resolve_layer, frames_per_state)."""
    n = x.shape[0]
    calls = _calls(apply_fn, params, x)
    if not calls:
        raise SaliencyInputError(
            "layer-based methods need a flax model: no flax module call was seen in apply_fn; "
            "use an input-gradient method (gradient, guided_backprop, ...) for plain functions")
    calls2 = _calls(apply_fn, params, jnp.concatenate([x, x]))
    if len(calls2) != len(calls):      # batch-size-dependent control flow: shapes at n only
        calls2 = [c._replace(shape=None if c.shape is None else (2 * c.shape[0],) + c.shape[1:])
                  for c in calls]
    rows = [_rows(c1, c2, n) for c1, c2 in zip(calls, calls2)]
    avail = _available(calls)
    if layer is None:
        spatial = [(c, k) for c, k in zip(calls, rows) if k is not None]
        convs = [(c, k) for c, k in spatial if "conv" in c.kind.lower()] or spatial
        if not convs:
            raise SaliencyInputError(
                f"no conv-like layer with output (N, h, w, K) found; pass layer= one of {avail}")
        c, k = convs[-1]
        twice = sum(q.qualified == c.qualified for q in calls)
        if twice > 1:
            raise called_more_than_once(c.qualified, twice)
        return (c.name if sum(q.name == c.name for q in calls) == 1 else c.qualified), k
    if not isinstance(layer, str):
        raise SaliencyInputError(f"layer must be a module name string, got {layer!r}; "
                                 f"available: {avail}")
    hits = [i for i, c in enumerate(calls) if _matches(c, layer)]
    if not hits:
        raise SaliencyInputError(f"unknown layer {layer!r}; available layers: {avail}")
    if len(hits) > 1 and len({calls[i].qualified for i in hits}) == 1:
        raise called_more_than_once(layer, len(hits))
    if len(hits) > 1:
        raise SaliencyInputError(
            f"layer {layer!r} matches {len(hits)} module calls in one forward pass "
            f"({', '.join(calls[i].qualified for i in hits)}); name one call by its qualified name "
            f"(RootClass/path) from: {avail}")
    i = hits[0]
    if rows[i] is None:
        raise SaliencyInputError(
            f"layer {layer!r} outputs shape {calls[i].shape} for N = {n} states and "
            f"{calls2[i].shape} for N = {2 * n}; CAM methods need a spatial layer with output "
            f"(N, h, w, K), or (k*N, h, w, K) for a trunk applied to k frames per state. "
            f"Spatial layers: {[c.name for c in calls if c.shape is not None and len(c.shape) == 4]}")
    return layer, rows[i]


def resolve_layer(apply_fn, params, x, layer: str | None) -> str:
    """The layer name to tap: `layer` checked against the model, or the last conv-like layer.

    Raises SaliencyInputError listing the available names for an unknown, ambiguous or
    non-spatial layer. x is one chunk of observations (N, ...) as the model takes them.
    A spatial layer outputs (k*N, h, w, K) with k fixed: k = 1, or k frames per state.
    """
    return _resolve(apply_fn, params, x, layer)[0]


def resolve_tap(apply_fn, params, x, layer: str | None, activation=None) -> tuple[str, int]:
    """(name, k): the layer to tap (as resolve_layer) and its output rows per state k (1, or
    k frames of a time-distributed trunk such as a shared per-frame CNN).

    k comes from the output's leading dimension at N and 2N states (k*N and 2k*N). For k > 1
    the rows must be state-major (row n*k + t is frame t of state n, as `reshape(N*T, ...)`
    of an (N, T, ...) batch gives): checked numerically by tapping N states and the same N
    states followed by N different ones, since a time-major trunk would mix states silently
    (eager calls only: under jit/vmap there are no values to check).
    """
    name, k = _resolve(apply_fn, params, x, layer)
    if k == 1:
        return name, 1
    if is_traced(params, x):  # values unknown under jit/vmap: the shape check above only
        return name, k
    x = jnp.asarray(x, jnp.float32)
    scale = max(float(jnp.abs(x).max()), 1.0)
    other = x + scale * jnp.asarray(np.random.default_rng(0).uniform(0.1, 0.6, x.shape), x.dtype)
    f = jax.jit(lambda p, xx: tap(apply_fn, name, activation)(p, xx, 0.0)[1])
    a1 = np.asarray(f(params, x), np.float64)
    a2 = np.asarray(f(params, jnp.concatenate([x, other])), np.float64)[: a1.shape[0]]
    tol = 1e-3 * float(np.abs(a1).max()) + 1e-6
    if not np.all(np.abs(a2 - a1) <= tol):
        raise SaliencyInputError(
            f"layer {name!r} outputs {k}*N rows (shape {a1.shape} for N = {x.shape[0]}) but its "
            f"rows are not state-major: the first {a1.shape[0]} rows change when other states "
            "join the batch. CAM methods read row n*k + t as frame t of state n; reshape the "
            "trunk input (N, T, ...) -> (N*T, ...) (not time-major (T*N, ...)) or tap a "
            "per-state layer")
    return name, k


def _available(calls) -> list[str]:
    out = []
    for c in calls:
        dup = sum(k.name == c.name for k in calls) > 1
        nm = c.qualified if dup else c.name
        if nm not in out:
            out.append(nm)
    return out


def get_activation(activation):
    """None, a name in ACTIVATIONS, or a callable -> callable or None."""
    if activation is None or callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise SaliencyInputError(
            f"layer_activation must be None, a callable or one of {sorted(ACTIVATIONS)}, "
            f"got {activation!r}")
    return ACTIVATIONS[activation]


def tap(apply_fn, layer: str, activation=None):
    """`f(params, x, eps) -> (output, A)`: the named module's output gets `+ eps`.

    A is the module output (after `activation` when given, which is then also what flows
    on, unchanged for an idempotent following ReLU). d(output)/d(eps) at eps = 0 is dY/dA.
    """
    act = get_activation(activation)

    def f(params, x, eps):
        store = []

        def hook(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if context.method_name == "__call__":
                names = _names(context.module)
                if names is not None and layer in names:
                    if act is not None:
                        out = act(out)
                    store.append(out)
                    out = out + eps
            return out

        with seeing_modules(hook):
            y = apply_fn(params, x)
        if len(store) > 1:
            raise called_more_than_once(layer, len(store))
        if not store:
            raise SaliencyInputError(f"layer {layer!r} was not called in the forward pass of apply_fn; "
                                     "name one of the layers `jaxsal agents --layers SPEC` lists")
        return y, store[0]

    return f


def layer_shape(apply_fn, params, x, layer: str):
    """Output shape of the named layer for this batch x."""
    for c in _calls(apply_fn, params, x):
        if _matches(c, layer):
            return c.shape
    raise SaliencyInputError(f"unknown layer {layer!r}")
