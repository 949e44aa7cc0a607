"""The perturbation methods on the one engine (jaxsal.engine): their shared spec pieces and
scoring helpers.

Every method describes one perturbation by an integer index (a grid position, a mask, a LIME
sample, a Score-CAM channel) and a pure `perturb(consts, state, idx) -> x'` on one NHWC state;
`perturbation_spec` makes it a `Spec`: per chunk of states the engine runs one group of
indices at a time (the perturbed inputs built on device, at most `batch_size` model rows),
each group's scores land in their columns of a (states, n_pert) table (the groups' parts sum
to it exactly), and `finish` turns the table into maps. Chunking, the greedy action, the
compile cache and the eager/traced loops are the engine's; the incremental forward pass
(jaxsal.perturbation._incremental) is exact by a trace-time proof where the model is local
between its convs; elsewhere it checks for a leak in every group, and `finalize` recomputes a
chunk's table from plain forward passes, in one `lax.cond`, when the model is not local. LIME's
superpixel samples take the superpixel pass (jaxsal.perturbation._superpixel) where it is proven.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import caching, engine, sizing
from jaxsal import targets as T
from jaxsal.batching import is_traced
from jaxsal.checks import _shapes_key
from jaxsal.checks import check_positive_float, check_positive_int, to_nhwc  # noqa: F401 (the methods' C.*)
from jaxsal.engine.spec import Prepared, Spec
from jaxsal.errors import SaliencyInputError

SCORES = ("one_minus", "drop", "output_l2", "chosen_action", "softmax_drop", "target")
CALL = tuple(engine.CALL_ARGS)
"""The engine's own arguments of a method's signature (the rest are the spec's options)."""
def resolve_obs_max(obs, obs_max=None) -> float:
    """Top of the observation's value range: 255 for uint8/integer obs; for float obs 1.0 if
    every value is <= 1 else 255; bool -> 1. `fill` fractions are taken of this value."""
    if obs_max is not None:
        if isinstance(obs_max, bool) or not isinstance(obs_max, (int, float, np.number)) \
                or not math.isfinite(float(obs_max)) or float(obs_max) <= 0:
            raise SaliencyInputError(f"obs_max must be a positive finite number, got {obs_max!r}")
        return float(obs_max)
    dtype = np.dtype(obs.dtype if hasattr(obs, "dtype") else np.asarray(obs).dtype)
    if dtype == np.bool_:
        return 1.0
    if np.issubdtype(dtype, np.integer):
        return 255.0
    top = jnp.max(jnp.asarray(obs))
    if is_traced(top):  # decided on the values, as eagerly, but inside the caller's program
        return jnp.where(top <= 1.0, 1.0, 255.0).astype(jnp.float32)
    return 1.0 if float(top) <= 1.0 else 255.0


def resolve_fill(fill, x, obs_max: float):
    """Per-state fill value (N, 1, 1, C) on the obs scale.

    `fill` is a fraction of the value range (0 = black, 0.5 = grey: 127.5 for 0-255 frames),
    "black", "grey"/"gray", or "mean" (each state's mean value per stacked frame).
    """
    n, _, _, c = x.shape
    if isinstance(fill, str):
        name = fill.lower()
        if name == "mean":
            return jnp.mean(x, axis=(1, 2), keepdims=True)
        presets = {"black": 0.0, "grey": 0.5, "gray": 0.5, "white": 1.0}
        if name not in presets:
            raise SaliencyInputError(
                f"fill must be a number (fraction of the value range: 0 black, 0.5 grey), or one of "
                f"{sorted(presets) + ['mean']}; got {fill!r}")
        fill = presets[name]
    if isinstance(fill, bool) or not isinstance(fill, (int, float, np.number)) \
            or not math.isfinite(float(fill)):
        raise SaliencyInputError(
            f"fill must be a finite number (fraction of the value range: 0 black, 0.5 grey) or "
            f"'black'/'grey'/'mean', got {fill!r}")
    if isinstance(obs_max, (int, float)):  # on the host: a device fill would compile per new N
        return np.full((n, 1, 1, c), float(fill) * obs_max, np.float32)
    return jnp.full((n, 1, 1, c), float(fill) * obs_max, jnp.float32)  # obs_max may be traced


def _row_sq_norm(tree):
    leaves = jax.tree.leaves(tree)
    return sum(jnp.sum(jnp.reshape(v, (v.shape[0], -1)).astype(jnp.float32) ** 2, axis=1)
               for v in leaves)


def make_score(name: str, target: T.Target) -> Callable:
    """score(out0_rows, out1_rows, actions_rows) -> (rows,) comparing clean and perturbed outputs.

    one_minus: 1 - t(x'); drop: t(x) - t(x'); target: t(x'); output_l2: 1/2 ||f(x) - f(x')||^2
    over every output leaf (Greydanus); chosen_action: 1 - softmax(Q(x'))_a (Paper B's fix);
    softmax_drop: softmax(Q(x))_a - softmax(Q(x'))_a.
    """
    if name == "one_minus":
        return lambda o0, o1, a: 1.0 - target.score(o1, a)
    if name == "drop":
        return lambda o0, o1, a: target.score(o0, a) - target.score(o1, a)
    if name == "target":
        return lambda o0, o1, a: target.score(o1, a)
    if name == "output_l2":
        return lambda o0, o1, a: 0.5 * _row_sq_norm(jax.tree.map(lambda u, v: u - v, o0, o1))
    sm = T.get_target("softmax_chosen")
    if name == "chosen_action":
        return lambda o0, o1, a: 1.0 - sm.score(o1, a)
    if name == "softmax_drop":
        return lambda o0, o1, a: sm.score(o0, a) - sm.score(o1, a)
    raise SaliencyInputError(f"unknown score {name!r}; choose one of {list(SCORES)}")


def check_score(name, allowed) -> str:
    if name not in allowed:
        raise SaliencyInputError(f"unknown score {name!r}; this method accepts {list(allowed)}")
    return name


class Static(NamedTuple):
    """A perturbation method's traced pieces and sizes (the compile-cache key; no arrays).

    perturb(consts, st, idx) -> x' (H, W, C) of one state st (its rows: x NHWC, a, out0 and
    what `states` adds) under perturbation idx; score(out0, out1, a) -> (rows,); states(params,
    consts, x, extra) -> per-state arrays of a chunk (fill, a blurred copy, Score-CAM's activations);
    finish(consts, x, extra, scores (S, n_pert)) -> maps; box: (bh, bw, corner(idx) -> (r0, c0))
    for the incremental forward pass, or None; k: indices per group; groups: their count;
    superpixels: (jaxsal.perturbation._superpixel.FirstConv, fill kind) for the superpixel pass
    (consts "z" and "fill", per-state "sp_pixel_slot" and "sp_slot_segment"), or None."""
    perturb: Callable
    score: Callable
    states: Callable
    finish: Callable
    n_pert: int
    k: int
    box: tuple | None = None
    groups: int = 1
    superpixels: tuple | None = None


def _no_states(params, consts, x, extra):
    return {}


def prepared(call, *, perturb, score, finish, n_pert: int, consts=None, states=_no_states, box=None,
             per_state=None, model=None, superpixels=None) -> Prepared:
    """The engine's `Prepared` of a perturbation method: n_pert indices in balanced groups of
    k <= batch_size rows (jaxsal.sizing.plan; chunks then hold batch_size // k states). With no
    batch_size, a method that runs whole forward passes (no incremental `box`) takes the
    backend's forward-pass default rows (jaxsal.sizing.default_rows), fewer for a `model`
    (apply_fn, params) that normalises its activations."""
    if call.batch_size is not None or box is not None:
        rows = call.rows
    else:
        norm = model is not None and normalises_activations(*model, call)
        rows = sizing.rows(None, "forward_normalised" if norm else "forward")
    sizes = sizing.plan(call.x.shape[0], rows, 1, n_pert, balanced=True)
    k = sizes.group
    # host scalars: a jnp.int32 here compiled a program of its own on a first call
    groups = tuple(np.int32(j * k) for j in range(sizes.groups))
    return Prepared(Static(perturb, score, states, finish, n_pert, k, box, sizes.groups, superpixels),
                    {} if consts is None else consts, per_state or {}, groups, k, rows)


_NORMALISES = caching.LRU("models that normalise activations", 64)
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min")


def normalises_activations(apply_fn, params, call) -> bool:
    """Whether the model reduces an activation of rank >= 4 over some of its non-batch axes (a
    LayerNorm or GroupNorm over conv channels, a spatial pool): such models run whole forward
    passes faster in smaller chunks on CPU (jaxsal.sizing.default_rows). Read from the model's
    jaxpr on one state, memoised like the model check (jaxsal.checks._shapes_key)."""
    key = _shapes_key(apply_fn, None, call.layout, call.x.shape, call.params_sig)
    probe = lambda: _reduces_activations(apply_fn, params, call)  # noqa: E731
    return probe() if key is None else _NORMALISES.get_or_build(key, probe)


def _reduces_activations(apply_fn, params, call) -> bool:
    spec = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))  # noqa: E731
    # float32 frames, as the engine calls the model (checks.as_float): the memo key holds no dtype
    x = jax.ShapeDtypeStruct((1,) + tuple(call.x.shape[1:]), jnp.float32)
    try:
        closed = jax.make_jaxpr(apply_fn)(jax.tree.map(spec, params), x)
    except Exception:  # noqa: BLE001 - a model that will not trace this way keeps the plain default
        return False
    return _any_reduction(closed.jaxpr)


def _any_reduction(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in REDUCTIONS and eqn.invars and len(getattr(eqn.invars[0].aval, "shape", ())) >= 4 \
                and 0 not in eqn.params.get("axes", (0,)):
            return True
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and _any_reduction(inner):
                    return True
    return False


def apply_nhwc(apply_fn, layout):
    """The model on NHWC frames."""
    if layout == "NHWC":
        return apply_fn
    return lambda p, x: apply_fn(p, jnp.transpose(x, (0, 3, 1, 2)))


def _per_chunk(ctx, params, prep, rows):
    """What every group of a chunk reads, once per chunk: the clean output and the method's
    `states` (a blurred copy, Score-CAM's activations)."""
    st = prep.static
    x = to_nhwc(rows.x, ctx.layout)
    out = {"out0": ctx.apply_fn(params, rows.x), **st.states(params, prep.arrays, x, rows.extra)}
    if st.superpixels is not None:
        from jaxsal.perturbation import _superpixel

        conv, kind = st.superpixels
        x_fill = jnp.broadcast_to(fill_of(kind, prep.arrays["fill"], x), x.shape)
        out["sp_y_fill"], out["sp_terms"] = _superpixel.per_chunk(
            apply_nhwc(ctx.apply_fn, ctx.layout), params, x, x_fill, rows.extra["sp_pixel_slot"], conv)
    return out


def _scores(ctx, params, prep, rows, offset, plain: bool = False):
    """((S, k) scores of one group of indices, whether the incremental pass leaked: None where
    it cannot, having no run-time check), the incremental forward pass where the method has a
    box, unless `plain`."""
    st, consts = prep.static, prep.arrays
    x = to_nhwc(rows.x, ctx.layout)
    states = {"x": x, "a": rows.actions, **rows.extra}
    idx = jnp.minimum(offset + jnp.arange(st.k, dtype=jnp.int32), st.n_pert - 1)
    xp = jax.vmap(lambda s: jax.vmap(lambda i: st.perturb(consts, s, i))(idx))(states)  # (S, k, H, W, C)
    s_, k_ = xp.shape[:2]
    flat = xp.reshape((s_ * k_,) + xp.shape[2:])
    leaked = None
    if st.superpixels is not None and not plain:
        from jaxsal.perturbation import _superpixel

        out1 = _superpixel.apply(apply_nhwc(ctx.apply_fn, ctx.layout), params, flat, consts["z"][idx],
                                 rows.extra["sp_slot_segment"], rows.extra["sp_y_fill"], rows.extra["sp_terms"],
                                 st.superpixels[0])
    elif st.box is None or plain:
        # the barrier asks XLA to keep the perturbed inputs (RISE's masks, LIME's segments) apart
        # from the model's graph; jaxlib 0.10's XLA:CPU drops it before fusion (the input multiply
        # lands in the YNNPACK fusion). Building the inputs in a program of their own measured RISE
        # 1.08x, occlusion, LIME and SARFA 0.92-0.94x, so they stay in the one step program
        out1 = apply_nhwc(ctx.apply_fn, ctx.layout)(params, jax.lax.optimization_barrier(flat))
    else:
        from jaxsal.perturbation._incremental import incremental_apply

        to_layout = (lambda v: v) if ctx.layout == "NHWC" else (lambda v: jnp.transpose(v, (0, 3, 1, 2)))
        r0, c0 = jax.vmap(st.box[2])(idx)
        out1, leaked = incremental_apply(ctx.apply_fn, params, rows.x, to_layout(flat), jnp.tile(r0, s_),
                                         jnp.tile(c0, s_), st.box[:2], xp.shape[2:4], ctx.layout)
    out0 = jax.tree.map(lambda o: jnp.repeat(o, k_, axis=0), rows.extra["out0"])
    return st.score(out0, out1, jnp.repeat(rows.actions, k_, axis=0)).reshape(s_, k_), leaked


def _chunk(ctx, params, prep, rows, offset, shared):
    """(S, k * groups + 1): the scores of one group of indices in their columns, zero in the other
    groups', and in the last column 1 where its incremental pass leaked, else 0. The groups' parts
    sum to the chunk's table and, in one array (one eager add program), its leaked groups."""
    st = prep.static
    scores, leaked = _scores(ctx, params, prep, rows, offset)
    table = jnp.zeros((scores.shape[0], st.k * st.groups + 1), scores.dtype)
    if leaked is not None:
        table = table.at[:, -1].set(leaked.astype(scores.dtype))
    return jax.lax.dynamic_update_slice(table, scores, (jnp.int32(0), offset))


def _checked(ctx, params, prep, rows) -> bool:
    """Whether a group's incremental pass checks for a leak at run time (a trace, no compile)."""
    seen = {}

    def group(p):
        seen["leaked"] = _scores(ctx, p, prep, rows, jnp.int32(0))[1]
        return jnp.zeros(())

    jax.eval_shape(group, params)
    return seen["leaked"] is not None


def _finalize(ctx, params, prep, rows, acc):
    """Maps from the summed table; where an incremental pass leaked (a model that is not local: its
    convs' inputs changed outside the box), the chunk's table again from plain forward passes, group
    by group. One `lax.cond` per chunk: in every group's program it slowed occlusion ~1.3x. None
    where the incremental pass has no run-time check (proven local)."""
    st = prep.static
    table = acc[:, :-1]
    if st.box is not None and _checked(ctx, params, prep, rows):
        def plain():
            offsets = jnp.arange(st.groups, dtype=jnp.int32) * st.k
            parts = jax.lax.map(lambda o: _scores(ctx, params, prep, rows, o, plain=True)[0], offsets)
            return jnp.moveaxis(parts, 0, 1).reshape(table.shape)  # (groups, S, k) -> (S, groups * k)
        table = jax.lax.cond(jnp.any(acc[:, -1] > 0), plain, lambda: table)
    return st.finish(prep.arrays, to_nhwc(rows.x, ctx.layout), rows.extra, table[:, :st.n_pert])


def perturbation_spec(name: str, prepare: Callable, options: dict, *, stochastic: bool = False,
                      example: dict | None = None, frames_only: Callable | None = None) -> Spec:
    """A perturbation method as an engine spec; `prepare(call, apply_fn, params, **options)`
    checks the options and returns `prepared(...)`; `frames_only`: see jaxsal.engine.spec.Spec."""
    return Spec(name, prepare, _chunk, _finalize, options=options, example=example or {}, stochastic=stochastic,
                kind="perturbation", per_chunk=_per_chunk, frames_only=frames_only)


def register(spec: Spec, fn: Callable):
    """Register `spec` for `jaxsal.explain(method=name)`; the method function gets `fn`'s
    docstring (the method's own Args, Returns and Raises) and name."""
    method = engine.register(spec, module=fn.__module__, identity=(fn.__module__, fn.__qualname__))
    method.__doc__ = fn.__doc__
    return method


def options_of(fn: Callable) -> dict:
    """A method signature's own options and their defaults (what its spec takes)."""
    return {k: p.default for k, p in list(inspect.signature(fn).parameters.items())[3:] if k not in CALL}


def fill_value(fill, obs, obs_max=None):
    """(kind, value) of a `fill` option: ("mean", None), each state's mean per stacked frame, or
    ("const", the fill on the obs scale, a scalar: traced when obs_max is)."""
    if isinstance(fill, str) and fill.lower() == "mean":
        return "mean", None
    return "const", resolve_fill(fill, np.zeros((1, 1, 1, 1), np.float32), resolve_obs_max(obs, obs_max))[0, 0, 0, 0]


def fill_of(kind, value, x):
    """The fill of NHWC states x (..., H, W, C): their means (..., 1, 1, C), or the constant."""
    return jnp.mean(x, axis=(-3, -2), keepdims=True) if kind == "mean" else value


def use_incremental(incremental, box_hw, image_hw) -> bool:
    """incremental=None (auto, the methods' default): on when the perturbed box covers <= 1/4 of
    the image. Measured on XLA:CPU (2 cores, 64-row chunks, exact conv windows) for the Nature
    CNN with and without LayerNorm: 2x2 occlusion 2.2-2.5x, noise sensitivity's 27x27 box
    1.5-2.7x and SARFA 2.5x faster than the plain path, with equal results (tested)."""
    if incremental is None:
        return box_hw[0] * box_hw[1] * 4 <= image_hw[0] * image_hw[1]
    if not isinstance(incremental, bool):
        raise SaliencyInputError(f"incremental must be True, False or None (auto), got {incremental!r}")
    return incremental


UPSAMPLE = {"bilinear": "linear", "nearest": "nearest"}


def check_upsample(method: str) -> str:
    if method not in UPSAMPLE:
        raise SaliencyInputError(f"upsample must be one of {sorted(UPSAMPLE)}, got {method!r}")
    return method


def resize_grid(scores, grid_hw, hw, method: str = "bilinear"):
    """(S, gy * gx) or (S, gy, gx) scores -> (S, gy, gx) grid, resized to (S, H, W) (half-pixel
    centres, as PIL/skimage do) unless hw is None; traced."""
    grid = scores.reshape((scores.shape[0],) + tuple(grid_hw))
    if hw is None or tuple(grid_hw) == tuple(hw):
        return grid
    return jax.image.resize(grid, (scores.shape[0],) + tuple(hw), UPSAMPLE[check_upsample(method)])


def upsample_grid(grid, hw, method: str = "bilinear"):
    """(N, gy, gx) score grid -> (N, H, W) map (half-pixel-centred resize, as PIL/skimage do)."""
    return resize_grid(grid, grid.shape[1:], hw, method)


def check_fits(name: str, value, hw, minimum: int = 1) -> int:
    """A patch/stride size: integer >= minimum and <= the image side."""
    value = check_positive_int(name, value, minimum)
    if value > min(hw):
        raise SaliencyInputError(
            f"{name}={value} does not fit the {hw[0]}x{hw[1]} image: it must be <= {min(hw)}")
    return value
