"""The front door: `jaxsal.explain(apply_fn, params, obs, method=...)` for every method (this
module is `jaxsal.front`, so that `jaxsal.explain` names one thing, the function)."""
from __future__ import annotations

from typing import Sequence

from jaxsal.checks import check_values, values_checked
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
    # layout, pixels, target and actions are checked by every method in jaxsal.checks.check_call, so
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
    calls = {m: (m, {k: v for k, v in common.items() if k in accepted[m]},
                 {k: v for k, v in options.items() if k in accepted[m]}) for m in dict.fromkeys(methods)}
    check_values(obs, getattr(apply_fn, "jaxsal_pixels", None))  # once, not once per method
    out = {}
    with values_checked():
        for group in share_groups(calls):
            out.update(explain_group(apply_fn, params, obs, calls, group))
    return {m: out[m] for m in calls}


SHARED = ("target", "actions", "layout", "batch_size", "per_frame", "fast_conv")
"""Settings one shared computation of the single-backward family applies to all its methods."""
LAYER_SHARED = ("layer", "layer_activation")
"""Settings that must also agree between the CAM methods of one shared computation."""


def _family_settings(method, common, options):
    """(key, layer key, compute kwargs) of a single-backward family method called with `common`
    and `options` (as call_method takes them), or None when it must run alone: not in the
    family, or an argument the shared computation does not take (its own call reports it)."""
    import inspect

    from jaxsal.backprop.family import FAMILY, LAYER_METHODS

    if method not in FAMILY:
        return None
    fn = get_method(method)
    acc = accepted_options(fn)
    if any(k not in acc for k in options) or any(k not in acc and not is_default(k, v)
                                                 for k, v in common.items()):
        return None
    args = {**{k: v for k, v in common.items() if k in acc}, **options}
    names = SHARED + (LAYER_SHARED if method in LAYER_METHODS else ())
    sig = inspect.signature(fn).parameters
    if set(args) - set(names) - {"key"} or any(k not in sig for k in names):
        return None  # an option the shared computation would drop: never silently
    kw = {k: args.get(k, sig[k].default) for k in names}
    key = tuple(_token(kw[k]) for k in SHARED)
    lkey = tuple(_token(kw[k]) for k in LAYER_SHARED) if method in LAYER_METHODS else None
    return key, lkey, kw


def _token(v):
    """A hashable stand-in for a setting: arrays (actions) and unhashable values by identity."""
    if getattr(v, "ndim", 0):
        return ("id", id(v))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return v


def share_groups(calls: dict) -> list[list]:
    """Split calls {name: (method, common, options)} into the groups computed together: family
    methods with identical shared settings (CAM methods also the same layer) form one group;
    every other call is a group of its own. Groups follow the order of first appearance."""
    groups, classes = [], {}
    for name, (method, common, options) in calls.items():
        s = _family_settings(method, common, options)
        if s is None:
            groups.append([name])
            continue
        key, lkey, _ = s
        cls = classes.setdefault(key, {})  # layer key -> group; None: input methods only so far
        if lkey is None:  # input-gradient methods join the first group of their settings
            g = next(iter(cls.values()), None)
            if g is None:
                g = cls[None] = []
                groups.append(g)
        elif lkey in cls:
            g = cls[lkey]
        elif list(cls) == [None]:  # the input methods so far join this CAM layer
            g = cls[lkey] = cls.pop(None)
        else:
            g = cls[lkey] = []
            groups.append(g)
        g.append(name)
    return groups


def explain_group(apply_fn, params, obs, calls: dict, group) -> dict:
    """Maps {name: maps} of one group of share_groups(calls): one jaxsal.backprop.family.compute
    for several methods (per chunk one forward, one backward per ReLU rule), else its own call."""
    if len(group) == 1:
        method, common, options = calls[group[0]]
        return {group[0]: call_method(method, apply_fn, params, obs, common, options)}
    from jaxsal.backprop.family import compute

    settings = [_family_settings(*calls[n]) for n in group]
    lkeys = {s[1] for s in settings if s is not None and s[1] is not None}
    if any(s is None for s in settings) or len({s[0] for s in settings}) > 1 or len(lkeys) > 1:
        raise ValueError(f"{list(group)} cannot be computed together; group calls with share_groups")
    kw = next((s[2] for s in settings if s[1] is not None), settings[0][2])  # a CAM method's: + layer
    methods = tuple(calls[n][0] for n in group)
    maps = compute(methods, apply_fn, params, obs, **kw)
    return {n: maps[calls[n][0]] for n in group}
