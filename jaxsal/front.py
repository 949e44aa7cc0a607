"""The front door: `jaxsal.explain(apply_fn, params, obs, method=...)` for every method, and
`jaxsal.register` to add one (this module is `jaxsal.front`, so that `jaxsal.explain` names one
thing, the function)."""
from __future__ import annotations

import sys
from typing import Callable, Sequence

from jaxsal import engine, registry
from jaxsal.backprop.cam import CamSpec
from jaxsal.backprop.single_backward import register_cam
from jaxsal.checks import check_values, values_checked
from jaxsal.engine.spec import Spec
from jaxsal.errors import SaliencyInputError
from jaxsal.registry import SPECS, accepted_options, call_method, get_method, is_default


def explain(apply_fn, params, obs, method: str | Spec | Sequence[str | Spec] = "gradcam", target="q_chosen",
            layer: str | None = None, per_frame: bool = False, layout: str | None = None, key=None,
            batch_size: int | None = None, actions=None, precision: str = "float32", **options):
    """Saliency maps of a batch of observations by any registered method, or by several at once.

    Targets: `target` says which scalar per state is explained (jaxsal.targets), by default the
    Q-value of the greedy action; `actions` gives per-state actions for "q_action" or overrides
    the chosen action of the other targets.

    Layers: CAM methods tap the flax module named by `layer` (e.g. "conv3", CleanRL's
    "Conv_2"), by default the last conv-like layer; `jaxsal.layer_calls(apply_fn, params, obs)`
    and `jaxsal agents --layers SPEC` list the names.

    Layouts: frames are NHWC or NCHW, by default the model's declared layout (agents from
    `jaxsal.loaders` declare theirs), else NHWC; frames whose shape contradicts it are an error
    unless `layout` is given. Agents that declare uint8 pixels reject frames outside 0..255 and
    float frames in [0, 1].

    Batching: states run in chunks of `batch_size` (default: sized to fit the device); maps do
    not depend on it, and the same call works under jit, vmap and lax.scan.

    Precision: "bfloat16" runs the model's convolutions and matmuls, backward passes included,
    on bfloat16 operands with float32 accumulation (jaxsal.engine.precision), also in models that
    cast their input to float32; maps stay float32 and the explained action is the float32 choice.

    `jaxsal.methods()` lists the methods, `jaxsal.method_options(name)` gives one method's
    options with their defaults and `jaxsal.options_table()` all of them.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs)`, any pure JAX function (array or
            pytree output).
        params (PyTree): the model's parameters.
        obs (jax.Array): a batch of N observations, (N, H, W, C) or (N, C, H, W).
        method (str | jaxsal.engine.Spec | Sequence[str | jaxsal.engine.Spec]): a method name (see
            `jaxsal.methods()`), a spec such as `jaxsal.noise_tunnel("gradcam", n=16)`, or a list
            of them.
        target (str | Callable): "q_chosen", "q_action" (needs actions), "advantage", "value",
            "policy_logit", "log_prob", "softmax_chosen", or a callable output -> (N,).
        layer (str | None): the flax module name a CAM method taps; None: the last conv-like layer.
        per_frame (bool): keep the frame or channel axis last instead of summing it.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        key (jax.Array | None): the PRNG key (jax.random.key(0)) of a stochastic method.
        batch_size (int | None): states per chunk; None: sized to fit the device.
        actions (jax.Array | None): per-state actions (N,) int; None: the target's greedy choice.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls.
        **options (Any): the method's own options, e.g. `n_samples`, `steps`, `patch`.

    Returns:
        jax.Array | dict[str, jax.Array]: maps (N, H, W); with per_frame=True (N, H, W, C) for
            input-gradient methods or (N, H, W, T) for CAM methods on a trunk shared by T frames.
            A list of methods gives a dict name -> maps.

    Raises:
        jaxsal.SaliencyInputError: an unknown method or option, an option no listed method
            takes, an empty method list, an unknown precision, or frames, actions or a layer that
            do not fit the model.
    """
    # layout, pixels, target and actions are checked by every method in jaxsal.checks.check_call, so
    # a method called directly (jaxsal.gradcam(...)) and the batch job get the same checks
    common = dict(target=target, layer=layer, per_frame=per_frame, layout=layout, key=key,
                  batch_size=batch_size, actions=actions, precision=precision)
    if isinstance(method, (list, tuple)) and not isinstance(method, Spec):
        return _explain_many(list(method), apply_fn, params, obs, common, options)
    return call_method(_function(method), apply_fn, params, obs, common, options)


def _function(method):
    """The method function of a name or a spec."""
    return engine.method_function(method) if isinstance(method, Spec) else get_method(method)


def _name(method) -> str:
    return method.name if isinstance(method, Spec) else method


def _explain_many(methods, apply_fn, params, obs, common, options):
    """Several methods in one call: each gets the options it accepts; methods whose share keys
    agree (the single-backward gradient/CAM methods) share one forward/backward per chunk."""
    if not methods:
        raise SaliencyInputError("method list is empty; pass at least one method name")
    names = [_name(m) for m in methods]
    accepted = {_name(m): accepted_options(_function(m)) for m in methods}
    for name, value in {**common, **options}.items():
        if name in options or not is_default(name, value):
            if not any(name in acc for acc in accepted.values()):
                raise SaliencyInputError(f"none of the methods {names} takes {name}={value!r}")
    calls = {_name(m): (m, {k: v for k, v in common.items() if k in accepted[_name(m)]},
                        {k: v for k, v in options.items() if k in accepted[_name(m)]}) for m in methods}
    check_values(obs, getattr(apply_fn, "jaxsal_pixels", None))  # once, not once per method
    out = {}
    with values_checked():
        for group in share_groups(calls):
            out.update(explain_group(apply_fn, params, obs, calls, group))
    return {m: out[m] for m in calls}


def _spec(method):
    return method if isinstance(method, Spec) else SPECS.get(method)


def _engine_call(method, common, options):
    """(spec, options, call arguments) of a call the engine runs as it is, or None (no spec, or
    an argument its own call must report)."""
    spec = _spec(method)
    if spec is None:
        return None
    call = {k: common.get(k, v) for k, v in engine.CALL_ARGS.items()}
    own = {**{k: v for k, v in common.items() if k not in engine.CALL_ARGS}, **options}
    if any(k not in spec.options for k in options) or any(
            k not in spec.options and not is_default(k, v) for k, v in own.items()):
        return None
    return spec, {k: v for k, v in own.items() if k in spec.options}, call


def _share(method, common, options):
    """(key, detail, spec, options, call arguments) of a call that may share its computation, or
    None (no share key, or an argument its own call must report)."""
    bound = _engine_call(method, common, options)
    if bound is None or bound[0].share_key is None:
        return None
    spec, own, call = bound
    key, detail = spec.share_key({**spec.options, **own})
    key = (tuple(_token(v) for v in call.values()), _token(key), _token(spec.shared))
    return key, (None if detail is None else _token(detail)), spec, own, call


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
    """Split calls {name: (method, common, options)} into the groups computed together: calls
    whose specs' share keys and call arguments agree, and whose details agree (a detail None,
    e.g. an input-gradient method, joins the first group of its key whatever its CAM layer);
    every other call is a group of its own. Groups follow the order of first appearance."""
    groups, classes = [], {}
    for name, (method, common, options) in calls.items():
        s = _share(method, common, options)
        if s is None:
            groups.append([name])
            continue
        key, detail = s[:2]
        cls = classes.setdefault(key, {})  # detail -> group; None: detail-free calls only so far
        if detail is None:
            g = next(iter(cls.values()), None)
            if g is None:
                g = cls[None] = []
                groups.append(g)
        elif detail in cls:
            g = cls[detail]
        elif list(cls) == [None]:  # the detail-free calls so far join this detail
            g = cls[detail] = cls.pop(None)
        else:
            g = cls[detail] = []
            groups.append(g)
        g.append(name)
    return groups


def explain_group(apply_fn, params, obs, calls: dict, group, outputs: bool = False):
    """Maps {name: maps} of one group of share_groups(calls): one engine run for all its
    methods (per chunk one forward, one backward per ReLU rule), else the method's own call.
    outputs=True: ({name: maps}, the engine's actions and model output (jaxsal.engine.run), or
    None for a method the engine does not run)."""
    if len(group) == 1:
        bound = _engine_call(*calls[group[0]]) if outputs else None
        if bound is None:
            method, common, options = calls[group[0]]
            maps = call_method(_function(method), apply_fn, params, obs, common, options)
            return ({group[0]: maps}, None) if outputs else {group[0]: maps}
        shares = [(None, None) + bound]
    else:
        shares = [_share(*calls[n]) for n in group]
    if any(s is None for s in shares) or len({s[0] for s in shares}) > 1 \
            or len({s[1] for s in shares if s[1] is not None}) > 1:
        raise ValueError(f"{list(group)} cannot be computed together; group calls with share_groups")
    res = engine.run([(s[2], s[3]) for s in shares], apply_fn, params, obs, **shares[0][4], outputs=outputs)
    return (dict(zip(group, res[0])), res[1]) if outputs else dict(zip(group, res))


def register(method: Spec | CamSpec | Callable | None = None, *, name: str | None = None,
             stochastic: bool | None = None, example: dict | None = None, replace: bool = False):
    """Add a saliency method: `jaxsal.explain(method=name)`, `jaxsal.methods()`, the CLI's
    `--methods` and the generated conformance checks all see it (`jaxsal.unregister` removes it).

    Three kinds of method, one call:

    - a `jaxsal.engine.Spec` (the method protocol: pure pieces run by the one engine, which
      chunks, compiles and picks the greedy action for it);
    - a CAM variant, `jaxsal.backprop.cam.CamSpec(weights, rule=, normalise=, guided_input=)` (as
      `jaxsal.register_cam`): the channel weights of the shared CAM engine;
    - a function `fn(apply_fn, params, obs, *, target=, actions=, layout=, batch_size=, **options)`
      giving (N, H, W) maps, e.g. a perturbation method built on `jaxsal.batching.map_batched`.

    Usable as a decorator on a function: `@jaxsal.register(name="mine", example={...})`.

    Args:
        method (jaxsal.engine.Spec | jaxsal.backprop.cam.CamSpec | Callable | None): the method;
            None: return a decorator.
        name (str | None): its name; None: the spec's name or the function's `__name__` (a CamSpec
            needs one).
        stochastic (bool | None): it needs `key=`; None: the spec's own flag (a function: False).
        example (dict | None): tiny options of its generated conformance case; None: the spec's
            `example` (a function or CamSpec: its defaults, a CamSpec's `layer="conv2"`).
        replace (bool): allow a name another method holds; `jaxsal.unregister` brings that one back.

    Returns:
        Callable: the method function, `fn(apply_fn, params, obs, **options)` (a decorator when
            `method` is None).

    Raises:
        jaxsal.SaliencyInputError: the name is empty or taken (and replace is False), or `method`
            is none of the three kinds.
    """
    if method is None:
        return lambda m: register(m, name=name, stochastic=stochastic, example=example, replace=replace)
    if isinstance(method, Spec):
        changes = {k: v for k, v in (("name", name), ("stochastic", stochastic), ("example", example))
                   if v is not None}
        spec = method._replace(**changes)
        return engine.register(spec, module=_caller_module(), replace=replace)
    if isinstance(method, CamSpec):
        if not name:
            raise SaliencyInputError("a CAM variant needs a name: jaxsal.register(CamSpec(...), name=\"mycam\")")
        return register_cam(name, method.weights, rule=method.rule, normalise=method.normalise,
                            guided_input=method.guided_input, example=example, replace=replace)
    if callable(method):
        return registry.register(name or getattr(method, "__name__", ""), bool(stochastic), replace=replace,
                                 example=example)(method)
    raise SaliencyInputError(f"jaxsal.register takes a jaxsal.engine.Spec, a jaxsal.backprop.cam.CamSpec or a "
                             f"method function, got {type(method).__name__}")


def _caller_module() -> str:
    """The module that called jaxsal.register (who defined the method: its identity)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "__main__") if frame is not None else "__main__"
