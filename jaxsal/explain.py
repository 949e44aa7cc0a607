"""The front door: `jaxsal.explain(apply_fn, params, obs, method=...)` for every method."""
from __future__ import annotations

from typing import Sequence

from jaxsal.registry import call_method


def explain(apply_fn, params, obs, method: str | Sequence[str] = "gradcam", target="q_chosen",
            layer: str | None = None, per_frame: bool = False, layout: str = "NHWC", key=None,
            batch_size: int | None = None, actions=None, **options):
    """Saliency maps for a batch of observations: `(N, H, W)`, or `(N, H, W, C)` with per_frame.

    apply_fn(params, obs) is any pure JAX function (array or pytree output). `method` is a
    name (see `jaxsal.methods()`) or a list of names, which returns a dict name -> maps.
    `target` says what is explained (see `jaxsal.targets`); `actions` gives per-sample actions
    for `target="q_action"` (or overrides the chosen action of the other targets). Options of
    the method (e.g. `n_samples`, `steps`, `patch`) pass as keyword arguments.
    """
    common = dict(target=target, layer=layer, per_frame=per_frame, layout=layout, key=key,
                  batch_size=batch_size, actions=actions)
    if isinstance(method, (list, tuple)):
        return {m: call_method(m, apply_fn, params, obs, common, options) for m in method}
    return call_method(method, apply_fn, params, obs, common, options)
