"""The front door: `jaxsal.explain(apply_fn, params, obs, method=...)` for every method (this
module is `jaxsal.front`, so that `jaxsal.explain` names one thing, the function)."""
from __future__ import annotations

from typing import Sequence

from jaxsal.errors import SaliencyInputError
from jaxsal.registry import accepted_options, call_method, get_method, is_default


def explain(apply_fn, params, obs, method: str | Sequence[str] = "gradcam", target="q_chosen",
            layer: str | None = None, per_frame: bool = False, layout: str | None = None, key=None,
            batch_size: int | None = None, actions=None, **options):
    """Saliency maps for a batch of observations: `(N, H, W)`, or with per_frame `(N, H, W, C)`
    (input-gradient methods) / `(N, H, W, T)` (CAM methods on a trunk shared by T frames).

    apply_fn(params, obs) is any pure JAX function (array or pytree output). `method` is a
    name (see `jaxsal.methods()`) or a list of names, which returns a dict name -> maps.
    `target` says what is explained (see `jaxsal.targets`); `actions` gives per-sample actions
    for `target="q_action"` (or overrides the chosen action of the other targets). Options of
    the method (e.g. `n_samples`, `steps`, `patch`) pass as keyword arguments.

    target: q_chosen (default: Q of the greedy action), q_action (needs actions=), advantage,
        value, policy_logit, log_prob, softmax_chosen, or a callable output -> (N,).
    layer: the flax module name a CAM method taps (e.g. "conv3", CleanRL's "Conv_2"); default
        the last conv layer. `jaxsal.layer_calls(apply_fn, params, obs)` or
        `jaxsal agents --layers SPEC` list the names.
    layout: "NHWC" or "NCHW"; default the model's declared layout (agents from
        `jaxsal.loaders` declare theirs), else NHWC. Frames whose shape contradicts it are an
        error unless layout= is given. Agents that declare uint8 pixels reject frames outside
        0..255 and float frames in [0, 1].
    """
    # layout, pixels, target and actions are checked by every method in jaxsal.call.check_call, so
    # a method called directly (jaxsal.gradcam(...)) and the batch job get the same checks
    common = dict(target=target, layer=layer, per_frame=per_frame, layout=layout, key=key,
                  batch_size=batch_size, actions=actions)
    if isinstance(method, (list, tuple)):
        return _explain_many(list(method), apply_fn, params, obs, common, options)
    return call_method(method, apply_fn, params, obs, common, options)


def _explain_many(methods, apply_fn, params, obs, common, options):
    """Several methods in one call: each gets the options it accepts; the single-backward
    gradient/CAM methods (see jaxsal.backprop.family) share one forward/backward per chunk."""
    if not methods:
        raise SaliencyInputError("method list is empty; pass at least one method name")
    accepted = {m: accepted_options(get_method(m)) for m in methods}
    for name, value in {**common, **options}.items():
        if name in options or not is_default(name, value):
            if not any(name in acc for acc in accepted.values()):
                raise SaliencyInputError(f"none of the methods {methods} takes {name}={value!r}")
    from jaxsal.backprop.family import FAMILY, LAYER_METHODS, compute
    out = {}
    shared = [m for m in dict.fromkeys(methods) if m in FAMILY]
    if len(shared) > 1:
        kw = {k: common[k] for k in ("target", "actions", "layout", "batch_size", "per_frame")}
        if "fast_conv" in options:
            kw["fast_conv"] = options["fast_conv"]
        if any(m in LAYER_METHODS for m in shared):
            kw["layer"] = common["layer"]
            kw["layer_activation"] = options.get("layer_activation")
        out.update(compute(tuple(shared), apply_fn, params, obs, **kw))
    for m in methods:
        if m in out:
            continue
        acc = accepted[m]
        own = {k: v for k, v in options.items() if k in acc}
        com = {k: v for k, v in common.items() if k in acc}
        out[m] = call_method(m, apply_fn, params, obs, com, own)
    return out
