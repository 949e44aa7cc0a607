"""Shared engine of the perturbation methods: clean forward, states x perturbations in chunks.

Inputs are checked by jaxsal.checks.check_call, the same step the gradient methods run first.

Every method describes one perturbation by an integer index (a grid position, a mask, a LIME
sample) and a pure `perturb(consts, state, idx) -> x'`; the engine builds the perturbed inputs
on device for a chunk of states x a chunk of indices, runs them through the model as one batch
of at most `batch_size` rows and scores them, at the call's precision (jaxsal.engine.precision;
the explained action is always the float32 choice). The Python loop runs over chunks only, never over
single masks or positions; each chunk shape compiles once (last chunks are padded). Traced
(inside the caller's jit/vmap/scan) the chunks run in lax.map (jaxsal.batching.run).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import targets as T
from jaxsal.batching import (LRU, cached_jit, chunk_size, in_host_memory, is_traced, map_batched, pad_rows,
                             per_state, run, static_key)
from jaxsal.checks import Call, as_float, check_call, check_positive_int, to_nhwc
from jaxsal.engine.precision import check_precision, with_precision
from jaxsal.errors import SaliencyInputError

SCORES = ("one_minus", "drop", "output_l2", "chosen_action", "softmax_drop", "target")


class CleanPass(NamedTuple):
    """A checked call plus what perturbing needs: NHWC float32 `x`, the top of the value range,
    the clean output and each state's fixed action; the precision of every forward pass."""
    call: Call
    x: jax.Array
    obs_max: float
    out0: object
    actions: jax.Array
    precision: str = "float32"

    @property
    def shape(self):
        return self.x.shape

    def __getattr__(self, name):
        """target, target_key, layout, rows, ...: the checked call's."""
        return getattr(self.call, name)


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


def _apply_layout(apply_fn, layout):
    if layout == "NHWC":
        return apply_fn
    return lambda p, x: apply_fn(p, jnp.transpose(x, (0, 3, 1, 2)))


def clean_pass(apply_fn, params, obs, *, layout=None, target="q_chosen", actions=None,
               batch_size=None, obs_max=None, precision="float32") -> CleanPass:
    """Check the call, run the clean forward and fix each state's action once."""
    check_precision(precision)
    call = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    layout = call.layout  # resolved: the caller's, else the model's declared one
    x = _float_nhwc(call.x, layout)
    vmax = resolve_obs_max(obs, obs_max)
    out0, chosen = map_batched(cached_jit(_clean_forward, apply_fn, layout, call.target, precision), params, x,
                               batch_size=call.rows)
    actions = chosen if call.actions is None else jnp.asarray(call.actions, jnp.int32)
    return CleanPass(call, x, vmax, out0, actions, precision)


def _float_nhwc(x, layout):
    """float32 NHWC frames; on the host for host arrays (a device cast or transpose compiles
    one program per new number of states)."""
    if isinstance(x, np.ndarray) or (in_host_memory(x) and not is_traced(x)):
        x = np.asarray(x, np.float32)
        return jax.device_put(x if layout == "NHWC" else np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    return to_nhwc(as_float(x), layout)


def _clean_forward(apply_fn, layout, target, precision):
    """The clean output (at `precision`) and each state's explained action (the target's choice,
    in float32), per chunk."""
    fn = _apply_layout(apply_fn, layout)
    low = with_precision(fn, precision)

    def f(params, x):
        out = low(params, x)
        choice = out if low is fn else fn(params, x)
        return out, jax.lax.stop_gradient(target.choose(choice)).astype(jnp.int32)
    return f


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


def _build_runner(apply_fn, layout, perturb, score, box=None, precision="float32"):
    """Jitted (params, consts, states chunk (S,..), idx (K,)) -> scores (S, K), the model at
    `precision`.

    With `box` = (bh, bw, corner(idx) -> (r0, c0)), the region each perturbation may change,
    the model runs incrementally (see _incremental): only the touched part of each conv."""
    model = _apply_layout(apply_fn, layout)
    to_layout = (lambda v: v) if layout == "NHWC" else (lambda v: jnp.transpose(v, (0, 3, 1, 2)))

    def run(params, consts, st, idx):
        xp = _perturbed(perturb, consts, st, idx)
        if box is None:
            return _scores(model, score, params, st, xp)
        from jaxsal.perturbation._incremental import incremental_apply

        s_, k_ = xp.shape[:2]
        flat = xp.reshape((s_ * k_,) + xp.shape[2:])
        r0, c0 = jax.vmap(box[2])(idx)
        out1, leaked = incremental_apply(apply_fn, params, to_layout(st["x"]), to_layout(flat),
                                         jnp.tile(r0, s_), jnp.tile(c0, s_), box[:2],
                                         xp.shape[2:4])
        return _scores(model, score, params, st, xp, out1), leaked

    return with_precision(run, precision)


def perturbation_scores(prep: CleanPass, apply_fn, params, *, perturb, score, n_pert: int,
                        consts=None, states=None, box=None):
    """(N, n_pert) scores of every state under every perturbation index 0..n_pert-1.

    perturb(consts, state, idx) -> x' (H, W, C) for ONE state (a dict of its rows: `x`, `a`,
    `out0`, plus `states`) and one index. score(out0, out1, a) -> (rows,) on the repeated clean
    output, the perturbed output and the actions. box=(bh, bw, corner(idx) -> (r0, c0)) bounds
    where perturbation idx changes the input and turns on the incremental forward pass. Runs
    chunks of S states x K indices with S*K <= batch_size rows (K <= n_pert); results stay on device.
    Every compiled function is keyed on the perturb/score/box functions themselves (their code
    and captured values: grid, patch, radius, ...; jaxsal.batching.cached_jit).
    """
    layout = prep.layout
    traced = is_traced(params, prep.x, consts, states, prep.out0)
    if jax.default_backend() == "cpu":
        fn = _split_runner(apply_fn, layout, perturb, score, prep.precision)
    else:
        fn = cached_jit(_build_runner, apply_fn, layout, perturb, score, None, prep.precision)
    if box is not None:
        local_key = static_key((apply_fn, layout, perturb, score, box))
    if box is not None and (traced or local_key not in _NON_LOCAL):
        scores, leaked = _run_chunks(prep, params, n_pert, consts, states, cached_jit(
            _build_incremental_runner, apply_fn, layout, perturb, score, box, prep.precision))
        if traced:  # no host round trip inside the caller's program: branch on device
            return jax.lax.cond(leaked, lambda: _run_chunks(prep, params, n_pert, consts, states,
                                                            fn)[0], lambda: scores)
        if not bool(leaked):
            return scores
        _NON_LOCAL[local_key] = apply_fn  # the model is not local: plain path from now on
    return _run_chunks(prep, params, n_pert, consts, states, fn)[0]


def _build_incremental_runner(apply_fn, layout, perturb, score, box, precision):
    return _build_runner(apply_fn, layout, perturb, score, box, precision)


def _build_inputs(perturb):
    return lambda consts, st, idx: _perturbed(perturb, consts, st, idx)


def _build_scores(apply_fn, layout, score, precision):
    model = _apply_layout(apply_fn, layout)
    return with_precision(lambda params, st, xp: _scores(model, score, params, st, xp), precision)


def _split_runner(apply_fn, layout, perturb, score, precision):
    """The plain runner as two compiled calls, perturbed inputs then model + score. On XLA:CPU
    with YNNPACK kernels the perturbation fused into the model's graph slowed RISE's forward
    passes by ~20% (137 vs 111 us per row at 63 rows); apart they cost one more dispatch."""
    inputs = cached_jit(_build_inputs, perturb)
    scores = cached_jit(_build_scores, apply_fn, layout, score, precision)
    return lambda params, consts, st, idx: scores(params, st, inputs(consts, st, idx))


def _perturbed(perturb, consts, st, idx):
    """(S, K, H, W, C): every state of the chunk under every perturbation index."""
    return jax.vmap(lambda s: jax.vmap(lambda i: perturb(consts, s, i))(idx))(st)


def _scores(model, score, params, st, xp, out1=None):
    """(S, K) scores of the perturbed inputs xp (S, K, ...) (out1: their model outputs if known)."""
    s_, k_ = xp.shape[:2]
    if out1 is None:
        out1 = model(params, xp.reshape((s_ * k_,) + xp.shape[2:]))
    out0 = jax.tree.map(lambda o: jnp.repeat(o, k_, axis=0), st["out0"])
    a = jnp.repeat(st["a"], k_, axis=0)
    return score(out0, out1, a).reshape(s_, k_)


_NON_LOCAL = LRU("non-local models", 256)  # static_key of (apply_fn, layout, perturb, score, box) -> apply_fn


def _run_chunks(prep, params, n_pert, consts, states, fn):
    """(scores (N, n_pert), any leak) from fn over chunks of states x perturbation indices."""
    n = prep.x.shape[0]
    st = {"x": prep.x, "a": prep.actions, "out0": prep.out0, **(states or {})}
    consts = {} if consts is None else consts
    k = min(n_pert, prep.rows)
    k = int(math.ceil(n_pert / math.ceil(n_pert / k)))  # balance the index chunks
    n_k = int(math.ceil(n_pert / k))
    s = chunk_size(n, prep.rows, rows_per_state=k)
    idx = pad_rows(jnp.arange(n_pert, dtype=jnp.int32), n_k * k).reshape(n_k, k)
    traced = is_traced(params, st, consts)

    def chunk_fn(chunk):
        """(S, n_pert) scores of a chunk of states and its (S,) leak flags."""
        if traced and n_k > 1:
            res = jax.lax.map(lambda i: fn(params, consts, chunk, i), idx)
            sc, leak = res if isinstance(res, tuple) else (res, jnp.zeros(n_k, bool))
            sc = jnp.moveaxis(sc, 0, 1).reshape(sc.shape[1], n_k * k)
            leak = jnp.any(leak)
        else:
            cols, leaks = [], []
            for j in range(n_k):
                res = fn(params, consts, chunk, idx[j])
                if isinstance(res, tuple):
                    res, lk = res
                    leaks.append(lk)
                cols.append(res)
            sc = cols[0] if n_k == 1 else jnp.concatenate(cols, axis=1)
            leak = jnp.any(jnp.stack(leaks)) if leaks else jnp.bool_(False)
        return sc[:, :n_pert], jnp.broadcast_to(leak, sc.shape[:1])

    scores, leaks = run(chunk_fn, st, s, traced)
    if not traced and in_host_memory(leaks):  # a device reduction would compile per new N
        return scores, bool(np.asarray(leaks).any())
    return scores, jnp.any(leaks)


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


def _grid_map(grid_hw, hw, method):
    """(S, gy * gx) or (S, gy, gx) scores -> (S, gy, gx) grid, resized to (S, H, W) unless hw is None."""
    def f(_, scores):
        grid = scores.reshape((scores.shape[0],) + tuple(grid_hw))
        if hw is None or tuple(grid_hw) == tuple(hw):
            return grid
        return jax.image.resize(grid, (scores.shape[0],) + tuple(hw), method)
    return f


def grid_map(scores, grid_hw, hw, method: str = "bilinear"):
    """(N, gy * gx) or (N, gy, gx) patch scores -> (N, H, W) map (half-pixel-centred resize, as PIL/skimage
    do), or the (N, gy, gx) grid itself with hw=None; in bucket-padded chunks (batching.per_state)."""
    if method not in UPSAMPLE:
        raise SaliencyInputError(f"upsample must be one of {sorted(UPSAMPLE)}, got {method!r}")
    return per_state(_grid_map, (tuple(grid_hw), None if hw is None else tuple(hw), UPSAMPLE[method]),
                     None, scores)


def upsample_grid(grid, hw, method: str = "bilinear"):
    """(N, gy, gx) score grid -> (N, H, W) map (half-pixel-centred resize, as PIL/skimage do)."""
    return grid_map(grid, grid.shape[1:], hw, method)


def check_fits(name: str, value, hw, minimum: int = 1) -> int:
    """A patch/stride size: integer >= minimum and <= the image side."""
    value = check_positive_int(name, value, minimum)
    if value > min(hw):
        raise SaliencyInputError(
            f"{name}={value} does not fit the {hw[0]}x{hw[1]} image: it must be <= {min(hw)}")
    return value


def check_positive_float(name: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) \
        and math.isfinite(float(value)) and (float(value) >= 0 if allow_zero else float(value) > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise SaliencyInputError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)
