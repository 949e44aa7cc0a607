"""Flax parameters saved with `flax.serialization.to_bytes` (PureJaxRL-style training scripts):
the module you trained plus its msgpack file give an agent. No pickle: the file's tree must
match `module.init`'s, leaf by leaf, or loading fails with the first mismatch."""
from __future__ import annotations

import math
from pathlib import Path

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.agent_spec import DeclaredFn, LoadedAgent, check_declared
from jaxsal.checks import INT32_MAX, output_shape
from jaxsal.loaders.errors import LoaderError, check_params, read_bytes


def plain_outputs(out):
    """A PureJaxRL ActorCritic returns (distrax.Categorical, value): give jaxsal the logits."""
    if isinstance(out, tuple) and len(out) == 2 and hasattr(out[0], "logits"):
        return {"logits": out[0].logits, "value": out[1]}
    if hasattr(out, "logits") and not isinstance(out, (dict, jax.Array)):
        return {"logits": out.logits}
    return out


def _check_arguments(obs_shape, layout, pixels):
    """What the template is built from and the agent declares: a JAX shape error or an allocation of terabytes
    (module.init runs on zeros of obs_shape) before, and a layout or pixel scale nothing checks frames against."""
    shape = tuple(obs_shape) if isinstance(obs_shape, (tuple, list)) else ()
    sizes_ok = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in shape)
    if not shape or not sizes_ok or math.prod(int(d) for d in shape) > INT32_MAX:
        raise LoaderError(f"flax_msgpack: obs_shape must be the shape of one observation in `layout`, integers >= 1 "
                          f"and at most 2**31-1 values in all, e.g. (84, 84, 4); got {str(obs_shape)[:80]}")
    check_declared(layout, pixels, "flax_msgpack", LoaderError)


def flax_msgpack(path, module, obs_shape, layout: str = "NHWC", pixels: str | None = None,
                 name: str | None = None, seed: int = 0) -> LoadedAgent:
    """An agent from your own flax module and its parameters saved with
    `flax.serialization.to_bytes` (PureJaxRL-style scripts); no pickle.

    The file's tree must match `module.init`'s leaf by leaf. A PureJaxRL ActorCritic's
    `(distrax.Categorical, value)` output is turned into `{"logits", "value"}`.

    Args:
        path (str | os.PathLike): the msgpack file (to_bytes of the params, with or without the
            outer {"params": ...}).
        module (flax.linen.Module): the module the parameters were trained with.
        obs_shape (tuple[int, ...]): the shape of one observation in `layout`, e.g. (84, 84, 4).
        layout (str): "NHWC" (default) or "NCHW", the agent's observation layout (declared on
            its `apply_fn`).
        pixels (str | None): "uint8" when the agent takes raw 0..255 frames (declared, so
            jaxsal checks inputs against it); None declares nothing.
        name (str | None): the agent's name; None: the file's stem.
        seed (int): seed of the template `module.init` (its values are discarded).

    Returns:
        jaxsal.agent_spec.LoadedAgent: `apply_fn`, `params`, `layout`, `num_actions` (None when
            the output has no (N, A) logits or Q-values), `pixels` and a `card`.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) `obs_shape`, `layout` or `pixels`
            is none of the values above; the file is missing or unreadable, is not flax msgpack, or its
            tree, a leaf's shape or kind (floating point) differs from `module.init`'s, or a leaf holds NaN
            or infinite values.
    """
    _check_arguments(obs_shape, layout, pixels)
    template = module.init(jax.random.PRNGKey(seed), jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    data = read_bytes(path)
    try:
        raw = flax.serialization.msgpack_restore(data)
    except Exception as e:
        raise LoaderError(f"{path}: not a flax msgpack file ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise LoaderError(f"{path}: expected a flax parameter tree, got {type(raw).__name__}; save "
                          "flax.serialization.to_bytes(params)")
    if "params" not in raw and "params" in template:
        raw = {**{k: v for k, v in template.items() if k != "params"}, "params": raw}
    check_params(path, raw, flax.serialization.to_state_dict(template), type(module).__name__)
    try:
        params = flax.serialization.from_state_dict(template, raw)
    except (ValueError, KeyError, TypeError) as e:
        raise LoaderError(f"{path}: parameters do not match {type(module).__name__}: "
                          f"{str(e).splitlines()[0]}") from None
    params = jax.tree.map(jnp.asarray, params)

    def apply_fn(p, x):
        return plain_outputs(module.apply(p, x))

    out = output_shape(apply_fn, params, (1,) + tuple(obs_shape), layout=layout)
    leaf = out.get("logits", out.get("q")) if isinstance(out, dict) else out
    n = int(leaf.shape[-1]) if hasattr(leaf, "shape") and len(leaf.shape) == 2 else None
    return LoadedAgent(name=name or Path(path).stem, apply_fn=DeclaredFn(apply_fn, layout, pixels), params=params,
                       layout=layout, num_actions=n, pixels=pixels,
                       card={"source": f"flax msgpack + {type(module).__name__}", "file": str(path),
                             "num_actions": n, "obs_shape": list(obs_shape)})
