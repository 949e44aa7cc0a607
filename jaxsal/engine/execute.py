"""The one engine: `run(bound, apply_fn, params, obs, ...)` executes specs (jaxsal.engine.spec)
eagerly, under the caller's jit / vmap / scan and in the batch job, the same way.

Here and nowhere else: the call is checked once (jaxsal.checks.check_call), chunks are sized
(model rows per state from every spec's `prepare`), the compile cache is keyed, and the greedy
action is chosen (jaxsal.targets.greedy, per chunk, inside the chunk's traced function, on the clean
frames, always in float32; that forward also gives the model outputs run(outputs=True) returns; a
spec that `chooses` makes the choice, and gives the output, on its own clean forward, so no second
forward runs) and the precision is applied (jaxsal.engine.precision: the chunk's traced pieces, their backward passes included).
Eagerly a Python loop over bucket-padded chunks calls the jitted chunk function (a single group
is one program; an inner loop is the clean forward, then one step program for every group and
one finalize, each compiled once); traced, the chunks run
in lax.map and the groups in lax.scan (jaxsal.batching.run).
"""
from __future__ import annotations

import inspect
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import batching, caching, registry, sizing
from jaxsal.checks import as_float, check_call, check_positive_int
from jaxsal.engine.precision import check_precision, with_precision
from jaxsal.engine.spec import Ctx, Prepared, Rows, Spec
from jaxsal.errors import SaliencyInputError
from jaxsal.targets import greedy

CALL_ARGS = {"target": "q_chosen", "actions": None, "layout": None, "batch_size": None, "precision": "float32"}
"""The arguments of every call the engine itself takes (the rest are the specs' options)."""


def bind(spec: Spec, options: dict) -> dict:
    """The spec's options with the caller's `options` over its defaults; an unknown one is an
    error naming what the spec accepts."""
    registry.check_options(spec.name, spec.options, options, shown=list(CALL_ARGS) + list(spec.options))
    return {**spec.options, **options}


def run(bound, apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
        batch_size=None, precision="float32", outputs: bool = False):
    """The outputs of specs [(spec, options), ...] on one call, in order. Several specs run in
    one chunk function (they must agree on their groups); specs with a `shared` piece (all the
    same one: see share_key) read one shared value per chunk. `precision` is a static argument
    of the chunk functions (their compile-cache key). With outputs=True also what the chunks'
    clean forward gave, as (maps list, {"actions": (N,) int32 explained, "output": the model's
    output pytree}) (the batch job stores these: no forward of its own); with no specs, only
    that forward runs."""
    bound = [(spec, bind(spec, opts)) for spec, opts in bound]
    first = first_index(bound)
    check_precision(precision)
    call = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    params = batching.on_device(params)
    preps = [spec.prepare(call, apply_fn, params, **opts) for spec, opts in bound]
    specs = tuple(spec for spec, _ in bound)
    groups = preps[0].groups if preps else (None,)
    if len(specs) > 1 and any(len(p.groups) != 1 or p.groups[0] is not None for p in preps):
        raise SaliencyInputError(f"{[s.name for s in specs]}: only methods without an inner loop run together")
    shared = {s.shared for s in specs}
    if len(shared) > 1:
        raise SaliencyInputError(f"{[s.name for s in specs]} share no computation; run them separately")
    ctx = Ctx(apply_fn, call.target, call.layout)
    rows = {"x": call.x, "extra": [p.per_state for p in preps]}
    if any(s.indexed for s in specs):  # a host array, chunked like the frames (no program per N)
        rows["index"] = first + np.arange(call.x.shape[0], dtype=np.int32)
    if call.actions is not None:
        rows["actions"] = call.actions
    per_state = max([p.rows_per_state for p in preps], default=1)
    # no batch_size from the caller: the rows the methods sized themselves for (Prepared.rows)
    wanted = [p.rows for p in preps]
    per_call = min(wanted) if call.batch_size is None and wanted and None not in wanted else call.rows
    size = sizing.plan(call.x.shape[0], per_call, per_state).states
    statics = tuple(p.static for p in preps)
    pieces = tuple(Pieces(s.chunk, s.finalize, s.shared, s.chooses, s.per_chunk) for s in specs)  # the traced ones: the cache key
    arrays = [p.arrays for p in preps]
    traced = batching.is_traced(params, rows, arrays, groups)
    if len(groups) == 1:
        program = caching.cached_jit(_build, pieces, ctx, statics, "whole", precision, outputs)
        per_chunk = lambda r: program(params, arrays, r, groups[0])  # noqa: E731
    else:  # one program per role, each compiled once (the step's inputs keep one structure): the
        # clean forward (the actions, the output), the specs' per-chunk arrays, a step per group,
        # the finalize
        start = caching.cached_jit(_clean, ctx, outputs)
        program, fin = (caching.cached_jit(_build, pieces, ctx, statics, w, precision) for w in ("step", "finalize"))
        before = (caching.cached_jit(_build, pieces, ctx, statics, "per_chunk", precision)
                  if any(s.per_chunk is not None for s in specs) else None)

        def per_chunk(r):
            acts, out = start(params, {k: r[k] for k in ("x", "actions") if k in r})
            r = dict(r, actions=acts)  # every group and finalize explain the same actions
            if before is not None:  # read by every group: computed once
                r["extra"] = [{**e, **a} for e, a in zip(r["extra"], before(params, arrays, r))]
            parts = batching.accumulate(lambda g: program(params, arrays, r, g), list(groups), traced)
            return fin(params, arrays, r, parts), acts, out

    maps, acts, out = _chunks(program, per_chunk, rows, size, traced)
    return (list(maps), {"actions": acts, "output": out}) if outputs else list(maps)


def first_index(bound) -> int:
    """The position of the call's first state in the buffer it belongs to (option first_index of
    the indexed specs, which key per-state draws by position): one value, a non-negative int."""
    values = {check_positive_int("first_index", opts.get("first_index", 0), 0)
              for spec, opts in bound if spec.indexed}
    if len(values) > 1:
        raise SaliencyInputError(f"methods run together need one first_index, got {sorted(values)}")
    return values.pop() if values else 0


def _chunks(program, per_chunk, rows, size, traced):
    """per_chunk over the chunks of rows (jaxsal.batching.run); `program` is its cached jitted
    function (tests count the programs a call runs here)."""
    return batching.run(per_chunk, rows, size, traced=traced)


class Pieces(NamedTuple):
    """A spec's traced pieces (prepare and the options, which may hold arrays, stay out of the key)."""
    chunk: Callable
    finalize: Callable
    shared: Callable | None
    chooses: bool = False
    per_chunk: Callable | None = None


def _build(specs, ctx, statics, what, precision="float32", with_outputs=False):
    """The traced chunk function of specs (their statics fixed): "whole" (one group: rows ->
    (maps, actions, model output or None)); or the inner loop's "per_chunk" (rows with actions ->
    each spec's Spec.per_chunk arrays, which the caller adds to the rows' extra), "step" (rows
    with actions, a group -> that group's parts) and "finalize" (rows with actions, summed parts
    -> maps), after `_clean` chose the actions. The clean forward runs in float32 (the greedy choice, the model
    output returned with_outputs); the specs' pieces are computed at `precision`."""
    def rows_of(params, arrays, r, acts, inline):
        """The specs' Prepared and Rows; inline: with their per-chunk arrays computed here."""
        x = as_float(r["x"])
        preps = [Prepared(st, a) for st, a in zip(statics, arrays)]
        rs = [Rows(x, acts, r.get("index"), e) for e in r["extra"]]
        if inline:
            rs = [rr if s.per_chunk is None else rr._replace(extra={**rr.extra, **s.per_chunk(ctx, params, p, rr)})
                  for s, p, rr in zip(specs, preps, rs)]
        return preps, rs

    def per_chunk_arrays(params, arrays, r):
        preps, rs = rows_of(params, arrays, r, r["actions"], False)
        return tuple({} if s.per_chunk is None else s.per_chunk(ctx, params, p, rr)
                     for s, p, rr in zip(specs, preps, rs))

    inline = what == "whole"  # in the inner loop's programs they come from the "per_chunk" one

    def pieces(params, arrays, r, acts, group):
        preps, rs = rows_of(params, arrays, r, acts, inline)
        value = specs[0].shared(ctx, params, preps, rs[0]) if specs and specs[0].shared is not None else None
        if acts is None:  # the shared piece's forward chose them (Spec.chooses)
            acts = value["actions"]
            rs = [rr._replace(actions=acts) for rr in rs]
        out = value.get("output") if isinstance(value, dict) else None
        return tuple(s.chunk(ctx, params, p, rr, group, value) for s, p, rr in zip(specs, preps, rs)), acts, out

    def finalized(params, arrays, r, acts, acc):
        preps, rs = rows_of(params, arrays, r, acts, inline)
        return tuple(s.finalize(ctx, params, p, rr, a) for s, p, rr, a in zip(specs, preps, rs, acc))

    pieces, outputs = with_precision(pieces, precision), with_precision(finalized, precision)
    if what == "per_chunk":
        return with_precision(per_chunk_arrays, precision)

    if what == "whole":
        clean = _clean(ctx, with_outputs)
        # the shared forward is the clean one in float32: the action is chosen there and the model
        # output (with_outputs) read from it, not from a second forward
        own = (precision == "float32" and bool(specs) and specs[0].shared is not None
               and all(s.chooses for s in specs))

        def whole(params, arrays, r, group):
            if own:
                given = r.get("actions")
                acts = None if given is None else jnp.asarray(given, jnp.int32)
                acc, acts, out = pieces(params, arrays, r, acts, group)
                return outputs(params, arrays, r, acts, acc), acts, out if with_outputs else None
            acts, out = clean(params, r)
            acc, acts, _ = pieces(params, arrays, r, acts, group)
            return outputs(params, arrays, r, acts, acc), acts, out
        return whole
    if what == "step":
        def step(params, arrays, r, group):
            return pieces(params, arrays, r, r["actions"], group)[0]
        return step

    def finalize(params, arrays, r, acc):
        return outputs(params, arrays, r, r["actions"], acc)
    return finalize


def _clean(ctx, with_outputs=False):
    """rows -> (the caller's actions as int32, else the target's greedy choice on the clean frames;
    the model output with_outputs, else None), in float32."""
    def clean(params, r):
        acts = r.get("actions")
        out = ctx.apply_fn(params, as_float(r["x"])) if acts is None or with_outputs else None
        acts = greedy(ctx.target, out) if acts is None else jnp.asarray(acts, jnp.int32)
        return acts, jax.lax.stop_gradient(out) if with_outputs else None
    return clean


def method_function(spec: Spec, module: str | None = None):
    """`fn(apply_fn, params, obs, *, target=..., actions=..., layout=..., batch_size=...,
    precision=..., **options)`: the spec as a function (what `jaxsal.explain(method=name)` calls)."""
    def method(apply_fn, params, obs, **kwargs):
        call = {k: kwargs.pop(k, v) for k, v in CALL_ARGS.items()}
        return run([(spec, kwargs)], apply_fn, params, obs, **call)[0]

    kw = inspect.Parameter.KEYWORD_ONLY
    pos = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("apply_fn", "params", "obs")]
    names = list(CALL_ARGS.items()) + [(k, v) for k, v in spec.options.items() if k not in CALL_ARGS]
    method.__signature__ = inspect.Signature(pos + [inspect.Parameter(k, kw, default=v) for k, v in names])
    method.__name__ = method.__qualname__ = spec.name
    method.__doc__ = method_doc(spec, [n for n, _ in names])
    if module is not None:
        method.__module__ = module
    method.jaxsal_spec = spec
    return method


_ARG_DOCS = {
    "apply_fn": "Callable: the model, `apply_fn(params, obs)`, any pure JAX function (array or pytree output).",
    "params": "PyTree: the model's parameters.",
    "obs": "jax.Array: a batch of N observations, (N, H, W, C) or (N, C, H, W) (see `layout`).",
    "target": "str | Callable: what is explained (jaxsal.targets): q_chosen (Q of the greedy action), "
              "q_action (needs actions), advantage, value, policy_logit, log_prob, softmax_chosen, or a "
              "callable output -> (N,).",
    "actions": "jax.Array | None: per-state actions (N,) int; None: the target's greedy choice.",
    "layout": 'str | None: "NHWC" or "NCHW"; None: the model\'s declared layout, else NHWC.',
    "batch_size": "int | None: states per chunk; None: sized to fit the device.",
    "precision": 'str: "float32" or "bfloat16": the precision of the convolutions and matmuls, backward '
                 "passes included (float32 accumulation; maps float32; the greedy action is chosen in float32).",
    "key": "jax.Array | None: the PRNG key (jax.random.key(0)) of a stochastic method or option.",
    "per_frame": "bool: keep the frame or channel axis last instead of summing it.",
    "fast_conv": "bool: run strided convolutions' input gradients as matmuls (same maps, faster).",
    "rule": 'str: the ReLU rule of the backward pass: "plain", "guided" or "deconvnet".',
    "layer": "str | None: the flax module name whose output is tapped; None: the last conv-like layer "
             "(`jaxsal.layer_calls` lists the names).",
    "layer_activation": 'str | None: where A is read: None or "module", the module\'s output; "post_relu", '
                        "the ReLU after it (jaxsal.backprop.cam_site).",
    "n_samples": "int: noisy copies per state.",
    "sigma": "float: noise standard deviation, as a fraction of each state's value range.",
    "variant": 'str: "mean", "squared" (or "sg2", SmoothGrad^2) or "vargrad" (the variance).',
    "fast_prefix": "bool: transpose the model's affine input prefix once per state instead of once per "
                   "sample or step (exactly the same sums, faster).",
    "steps": "int: quadrature steps along the path.",
    "baseline": 'str | jax.Array: "black" (zeros), "blur", "uniform" (U(min x, max x) per state, needs key) '
                "or an array broadcastable to obs.",
    "quadrature": 'str: the quadrature rule: "riemann_right", "riemann_middle", "riemann_left", '
                  '"riemann_trapezoid" or "gausslegendre".',
    "blur_sigma": 'float: Gaussian blur width in pixels of baseline "blur".',
    "return_error": "bool: also return the completeness error sum(attributions) - (y(x) - y(x0)) per state.",
    "first_index": "int: the position of obs[0] in the buffer it belongs to: state i's random draws (noise, a "
                   "uniform baseline) are those of position first_index + i, so explaining a buffer in slices "
                   "gives the maps of one call on all of it.",
}
"""`name (type): meaning` of every argument a method function may take (method_doc's Args)."""
_ARG_DOCS["method"] = _ARG_DOCS["quadrature"]  # integrated_gradients names its quadrature method=


def method_doc(spec: Spec, options: list) -> str:
    """The docstring of a spec's method function: the spec's doc, then Args (every argument of
    the signature), Returns and Raises sections."""
    args = "\n".join(f"    {n} ({_ARG_DOCS.get(n, 'Any: an option of the method.').replace(': ', '): ', 1)}"
                      for n in ("apply_fn", "params", "obs", *options))
    if "layer" in spec.options:
        shape = ("(N, H, W) maps, or per frame (N, H, W, T) with per_frame=True on a time-distributed layer "
                 "(input-resolution variants: (N, H, W, C))")
    else:
        shape = "(N, H, W) maps summed over channels, or (N, H, W, C) with per_frame=True"
    ret = f"jax.Array: {shape}."
    if "return_error" in spec.options:
        ret = f"jax.Array | tuple[jax.Array, jax.Array]: {shape}; with return_error=True, (maps, error (N,))."
    return (inspect.cleandoc(spec.doc or f"The {spec.name} saliency method.") + f"\n\nArgs:\n{args}\n\n"
            f"Returns:\n    {ret}\n\nRaises:\n    jaxsal.SaliencyInputError: an unknown option, an invalid "
            "value, or frames or actions that do not fit the model.\n")


def register(spec: Spec, *, module: str, identity: tuple | None = None, replace: bool = False):
    """Register `spec` under its name for `jaxsal.explain(method=name)` (jaxsal.registry) and
    return its method function; `identity` (module, qualified name) says who defined it (default
    the module and the spec's name), a taken name needs replace=True."""
    fn = method_function(spec, module)
    fn.jaxsal_identity = tuple(identity or (module, spec.name))
    registry.register(spec.name, spec.stochastic, replace=replace)(fn)
    registry.SPECS[spec.name] = spec
    return fn
