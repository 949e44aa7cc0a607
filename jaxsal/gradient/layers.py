"""Layer taps by flax module name: capture a module's output A and get dY/dA, no model edits.

`flax.linen.intercept_methods` sees every module call inside any `apply_fn`; the named
module's output gets a zero perturbation `eps` added, so d(target)/d(eps) = dY/dA.
Names are module paths ("conv3", CleanRL's "Conv_2", "trunk/conv1"), optionally prefixed
with the root module's class ("Network/Conv_2") to tell apart equal names of separate applies.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

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
        with nn.intercept_methods(record):
            return apply_fn(p, x)

    jax.eval_shape(run, params, x)
    return calls


def layer_calls(apply_fn, params, x) -> list[LayerCall]:
    """Every flax module call in `apply_fn(params, x)`, in order of completion."""
    return _calls(apply_fn, params, x)


def _matches(call: LayerCall, layer: str) -> bool:
    return layer in (call.name, call.qualified)


def _is_conv(call: LayerCall, n: int) -> bool:
    return (call.shape is not None and len(call.shape) == 4 and call.shape[0] == n
            and "conv" in call.kind.lower())


def resolve_layer(apply_fn, params, x, layer: str | None) -> str:
    """The layer name to tap: `layer` checked against the model, or the last conv-like layer.

    Raises SaliencyInputError listing the available names for an unknown, ambiguous or
    non-spatial layer. x is one chunk of observations (N, ...) as the model takes them.
    """
    n = x.shape[0]
    calls = _calls(apply_fn, params, x)
    if not calls:
        raise SaliencyInputError(
            "layer-based methods need a flax model: no flax module call was seen in apply_fn; "
            "use an input-gradient method (gradient, guided_backprop, ...) for plain functions")
    avail = _available(calls)
    if layer is None:
        convs = [c for c in calls if _is_conv(c, n)] or [
            c for c in calls if c.shape is not None and len(c.shape) == 4 and c.shape[0] == n]
        if not convs:
            raise SaliencyInputError(
                f"no conv-like layer with output (N, h, w, K) found; pass layer= one of {avail}")
        c = convs[-1]
        return c.name if sum(k.name == c.name for k in calls) == 1 else c.qualified
    if not isinstance(layer, str):
        raise SaliencyInputError(f"layer must be a module name string, got {layer!r}; "
                                 f"available: {avail}")
    hits = [c for c in calls if _matches(c, layer)]
    if not hits:
        raise SaliencyInputError(f"unknown layer {layer!r}; available layers: {avail}")
    if len(hits) > 1:
        raise SaliencyInputError(
            f"layer {layer!r} matches {len(hits)} module calls in one forward pass "
            f"({', '.join(h.qualified for h in hits)}); name one call by its qualified name "
            f"(RootClass/path) from: {avail}")
    c = hits[0]
    if c.shape is None or len(c.shape) != 4 or c.shape[0] != n:
        raise SaliencyInputError(
            f"layer {layer!r} outputs shape {c.shape}; CAM methods need a spatial layer with "
            f"output (N, h, w, K) = ({n}, h, w, K). Spatial layers: "
            f"{[k.name for k in calls if k.shape is not None and len(k.shape) == 4]}")
    return layer


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

        with nn.intercept_methods(hook):
            y = apply_fn(params, x)
        if len(store) != 1:
            raise SaliencyInputError(f"layer {layer!r} was called {len(store)} times in one "
                                     "forward pass; expected exactly once")
        return y, store[0]

    return f


def layer_shape(apply_fn, params, x, layer: str):
    """Output shape of the named layer for this batch x."""
    for c in _calls(apply_fn, params, x):
        if _matches(c, layer):
            return c.shape
    raise SaliencyInputError(f"unknown layer {layer!r}")
