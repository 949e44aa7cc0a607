"""Insertion and deletion fidelity (Paper B / Petsiuk 2018): how fast the agent's score
recovers (insertion) or collapses (deletion) when pixels are moved in order of saliency.

The curve follows the explanation's target (`jaxsal.explain`'s names: q_chosen, q_action,
value, advantage, policy_logit, log_prob, softmax_chosen, or a callable) on the action the
library's target resolution chooses on the clean input (or the caller's `actions`). A policy
target is followed as the action's probability: logits are defined only up to a per-state
constant, so a logit curve means nothing. All steps of all states run as one batched forward
pass per chunk of states: for a chunk of B states the model sees B x (steps + 1) stacks at once.
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import targets as T
from jaxsal.batching import map_batched
from jaxsal.caching import cached_jit
from jaxsal.checks import as_float, check_call, check_positive_float, check_positive_int, output_shape
from jaxsal.errors import SaliencyInputError
from jaxsal.metrics.similarity import check_maps

SUBSTRATES = ("black", "random", "blur")
SCORES = ("auto", "ratio", "normalized", "difference", "raw", "q_value", "advantage")
GENERAL = ("ratio", "normalized", "difference", "raw")      # defined for every target
Q_TARGETS = ("q_chosen", "q_action")
POLICY_TARGETS = ("policy_logit", "log_prob")               # followed as the action's probability
MAX_SCALE = 100.0  # a ratio or normalised curve beyond this magnitude divides by ~0: undefined (NaN)


def gaussian_blur(x, sigma: float, truncate: float = 4.0):
    """Spatial Gaussian blur of NHWC frames, each stacked frame on its own (never across frames).

    The same as `scipy.ndimage.gaussian_filter` with sigma (0, s, s, 0), mode "reflect": the
    substrate "blur" of `insertion` and `deletion`.

    Args:
        x (jax.Array): frames (N, H, W, C), float.
        sigma (float): the blur's standard deviation in pixels.
        truncate (float): the kernel's half-width in standard deviations (scipy's
            `truncate`).

    Returns:
        jax.Array: the blurred frames, shape (N, H, W, C); `x` itself when the kernel's radius
            `int(truncate * sigma + 0.5)` is 0.
    """
    radius = int(truncate * float(sigma) + 0.5)
    if radius == 0:
        return x
    t = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
    k = jnp.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    xp = jnp.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode="symmetric")
    h, w = x.shape[1], x.shape[2]
    rows = sum(k[i] * xp[:, i:i + h, :, :] for i in range(2 * radius + 1))
    return sum(k[i] * rows[:, :, i:i + w, :] for i in range(2 * radius + 1))


def _order_masks(m, steps: int, per_step: int):
    """(steps + 1, H, W) bool: True where a pixel is among the top t * per_step by saliency.

    Pixels are ranked by decreasing saliency; ties keep raster order (stable sort)."""
    flat = m.ravel()
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros(flat.shape[0], jnp.int32).at[order].set(jnp.arange(flat.shape[0], dtype=jnp.int32))
    counts = jnp.minimum(jnp.arange(steps + 1) * per_step, flat.shape[0])
    return (rank[None, :] < counts[:, None]).reshape((steps + 1,) + m.shape)


def scores_for(target) -> tuple[str, tuple]:
    """(the score `score="auto"` picks, every score defined) for a target name or callable.

    Q targets keep Paper B's `q_value` = Q_a(x_t) / Q_a(x); value follows V the same way (`ratio`);
    advantage, policy targets (the action's probability) and callables are followed as they are (`raw`)."""
    name = target if isinstance(target, str) else None
    if name in Q_TARGETS:
        return "q_value", ("q_value", "advantage") + GENERAL
    if name == "advantage":
        return "raw", ("advantage",) + GENERAL
    if name == "value":
        return "ratio", GENERAL
    return "raw", GENERAL


def _check_score(score, target, shown: str) -> tuple[str, tuple]:
    """(the resolved score or "all", the scores to compute); a score the target lacks is an error."""
    auto, defined = scores_for(target)
    if score not in SCORES + ("all",):
        raise SaliencyInputError(f"score must be one of {SCORES} or 'all', got {score!r}")
    if score == "q_value" and score not in defined:
        raise SaliencyInputError(
            f"score='q_value' is Q_a(x_t) / Q_a(x), defined for the Q targets {Q_TARGETS} on Q-values; target "
            f"{shown} is not: use score='ratio' (the same fraction of what it follows), 'normalized', "
            "'difference' or 'raw'")
    if score == "advantage" and score not in defined:
        raise SaliencyInputError(
            f"score='advantage' is Q_a(x_t) - mean_b Q_b(x_t), defined for Q targets and 'advantage' on "
            f"Q-values; target {shown} is not: use one of {GENERAL}")
    if score == "all":
        return "all", defined
    score = auto if score == "auto" else score
    return score, (score,)


def _follow(target):
    """f(out, actions) -> (M,): the scalar a curve follows; a policy target's action probability."""
    if target in POLICY_TARGETS:
        log_prob = T.get_target("log_prob").score
        return lambda o, a: jnp.exp(log_prob(o, a))
    return T.get_target(target).score


def _policy_only(apply_fn, params, x, layout) -> bool:
    """True when the model's output is a dict with policy logits and no Q-values (an actor-critic)."""
    out = output_shape(apply_fn, params, x.shape, layout=layout)
    return isinstance(out, dict) and not any(k in out for k in T.Q_KEYS) and any(k in out for k in T.LOGIT_KEYS)


def _build_substrate(substrate: str, layout: str, pixel_range: tuple, blur_sigma: float):
    lo, hi = pixel_range

    def fn(_, obs, keys):
        x = as_float(obs)
        x = x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))     # NHWC
        if substrate == "black":
            return jnp.zeros_like(x)
        if substrate == "random":
            return jax.vmap(lambda k: jax.random.uniform(k, x.shape[1:], jnp.float32, lo, hi))(keys)
        return gaussian_blur(x, blur_sigma)
    return fn


def _build(apply_fn, steps: int, per_step: int, layout: str, target, given: bool, clean: int,
           with_advantage: bool):
    """One compiled function per target (modes, substrates and scores differ only in data):
    x_t = where(top-t mask, first, second); the action is resolved on the clean row `clean` of
    each state's curve (x_t = x there) by jaxsal.targets.resolve_actions, unless `given`.
    Returns f (B, steps + 1), the actions (B,) and, for Q outputs, the advantage curve."""
    tgt = T.get_target(target)
    follow = _follow(target)

    def fn(params, first, second, maps, actions):
        b = first.shape[0]
        masks = jax.vmap(lambda m: _order_masks(m, steps, per_step))(maps)[..., None]  # (B,S+1,H,W,1)
        xt = jnp.where(masks, first[:, None], second[:, None])
        xt = xt.reshape((b * (steps + 1),) + first.shape[1:])
        if layout == "NCHW":
            xt = jnp.transpose(xt, (0, 3, 1, 2))
        out = apply_fn(params, xt)
        clean_out = jax.tree.map(lambda v: v.reshape((b, steps + 1) + v.shape[1:])[:, clean], out)
        a = T.resolve_actions(tgt, clean_out, actions if given else None)
        rows = jnp.repeat(a, steps + 1)
        res = {"f": follow(out, rows).reshape(b, steps + 1), "actions": a}
        if with_advantage:
            res["advantage"] = T.get_target("advantage").score(out, rows).reshape(b, steps + 1)
        return res
    return fn


def _scored(name, f, adv, clean: int, sub: int):
    """(curves (N, S+1), defined (N,) bool) of score `name` from the followed scalar f (N, S+1)."""
    f_clean, f_sub = f[:, clean:clean + 1], f[:, sub:sub + 1]
    if name == "advantage":
        return adv, jnp.ones(f.shape[0], bool)
    if name == "raw":
        return f, jnp.ones(f.shape[0], bool)
    if name == "difference":
        return f - f_sub, jnp.ones(f.shape[0], bool)
    if name in ("ratio", "q_value"):
        c = f / f_clean
        ok = (f_clean[:, 0] > 0) & jnp.all(jnp.isfinite(c) & (jnp.abs(c) <= MAX_SCALE), -1)
    else:  # normalized: 0 at the substrate, 1 at the clean input
        c = (f - f_sub) / (f_clean - f_sub)
        ok = jnp.all(jnp.isfinite(c) & (jnp.abs(c) <= MAX_SCALE), -1)
    return jnp.where(ok[:, None], c, jnp.nan), ok


WHY = {"ratio": f"the clean score is not clearly positive (the curve would exceed {MAX_SCALE:g} times it)",
       "normalized": "the clean and substrate scores are (nearly) equal"}


def _warn_undefined(mode, score, ok, target):
    """One RuntimeWarning naming how many states' `score` is undefined (NaN) and the score that always is."""
    if isinstance(ok, jax.core.Tracer) or bool(ok.all()):
        return
    shown = target if isinstance(target, str) else "a callable"
    policy = (" (if it reads a policy's logits, as from a (logits, value) tuple, pass target='log_prob': "
              "followed as the action's probability)" if target in Q_TARGETS else "")
    warnings.warn(f"{mode}: score {score!r} of target {shown!r} is undefined (NaN) for {int((~ok).sum())} of "
                  f"{ok.shape[0]} states, where {WHY['ratio' if score == 'q_value' else score]}{policy}; "
                  "score='difference' (the curve minus the fully removed input's score, in the target's "
                  "units) is defined for every state", RuntimeWarning, stacklevel=4)


def _curves(mode, apply_fn, params, obs, maps, substrate, pixels_per_step, score, key, target, actions,
            batch_size, layout, pixel_range, blur_sigma):
    if substrate not in SUBSTRATES:
        raise SaliencyInputError(f"substrate must be one of {SUBSTRATES}, got {substrate!r}")
    call = check_call(apply_fn, params, obs, target=target, actions=actions, layout=layout,
                      batch_size=batch_size)
    x, layout, (h, w, _) = call.x, call.layout, call.hwc
    shown = repr(target) if isinstance(target, str) else "a callable"
    if target in Q_TARGETS and _policy_only(apply_fn, params, x, layout):
        shown += " (on this model's policy logits: it has no Q-values)"
        target = "policy_logit"      # the "Q-vector" it reads is a policy's logits: follow pi(a|x_t)
    score, names = _check_score(score, target, shown)
    n = x.shape[0]
    m = check_maps(maps, "maps", shape=(n, h, w))
    per_step = check_positive_int("pixels_per_step", pixels_per_step)
    steps = math.ceil(h * w / per_step)
    if substrate == "random" and key is None:
        raise SaliencyInputError("substrate='random' needs key=jax.random.PRNGKey(seed) "
                                 "(same key -> same substrate)")
    if substrate == "blur":
        check_positive_float("blur_sigma", blur_sigma, hint=" (pixels)")
    try:
        lo, hi = (float(v) for v in pixel_range)
    except (TypeError, ValueError):
        raise SaliencyInputError(f"pixel_range must be (low, high), got {pixel_range!r}") from None
    base = jax.random.PRNGKey(0) if key is None else key
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n))
    sub_fn = cached_jit(_build_substrate, substrate, layout, (lo, hi), float(blur_sigma))
    sub = map_batched(sub_fn, None, x, keys, batch_size=call.rows)
    xs = as_float(x) if layout == "NHWC" else jnp.transpose(as_float(x), (0, 2, 3, 1))
    first, second = (xs, sub) if mode == "insertion" else (sub, xs)
    clean, empty = (steps, 0) if mode == "insertion" else (0, steps)   # rows where x_t = x, x_t = substrate
    given = call.actions is not None
    acts = call.actions if given else jnp.zeros((n,), jnp.int32)
    fn = cached_jit(_build, apply_fn, steps, per_step, layout, target, given, clean, "advantage" in names)
    res = map_batched(fn, params, first, second, m, acts, batch_size=call.rows, rows_per_state=steps + 1)
    out = {}
    for name in names:
        c, ok = _scored(name, res["f"], res.get("advantage"), clean, empty)
        out[name] = {"auc": c.mean(-1), "curves": c}
    if score == "all":   # NaN marks the undefined states of each score; no warning for scores not asked for
        return out
    _warn_undefined(mode, score, ok, target)
    return dict(out[score], score=score, actions=res["actions"])


def insertion(apply_fn, params, obs, maps, substrate: str = "black", pixels_per_step: int = 84,
              score: str = "auto", key=None, *, target="q_chosen", actions=None,
              batch_size: int | None = None, layout: str = "NHWC", pixel_range=(0.0, 255.0),
              blur_sigma: float = 5.0):
    """Insertion curves (Petsiuk 2018, Paper B): does the score recover fast when the most salient
    pixels are inserted first? Higher AUC = more faithful map.

    The curve starts from the substrate (x_0) and inserts the clean input's pixels in order of
    decreasing saliency (ties in raster order) until it reaches the clean input x; it follows
    f(x_t), the explanation's target on one action per state. All S + 1 steps of a chunk of
    states run as one batched forward pass.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output`.
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) with
            `layout="NCHW"`.
        maps (jax.Array | numpy.ndarray): one saliency map per state, (N, H, W), finite.
        substrate (str): what removed pixels become: "black" (0, the default), "random"
            (uniform in `pixel_range`, per pixel and frame; needs `key`) or "blur" (a spatial
            Gaussian blur of the state, `blur_sigma` px).
        pixels_per_step (int): pixels moved per step (all stacked frames of a pixel at once);
            the curve has S + 1 = ceil(H W / pixels_per_step) + 1 points.
        score (str): how the followed scalar f(x_t) becomes the curve, with x the clean input
            and x_0 the fully removed one: "ratio" f(x_t) / f(x) ("q_value" is its name for Q
            targets, Paper B's Q_a(x_t) / Q_a(x)); "normalized" (f(x_t) - f(x_0)) /
            (f(x) - f(x_0)), 0 at the substrate and 1 at the clean input; "difference"
            f(x_t) - f(x_0), in the target's units, defined for every state; "raw" f(x_t);
            "advantage" Q_a(x_t) - mean_b Q_b(x_t) (Q targets and "advantage"); "auto" (default)
            q_value for q_chosen/q_action, ratio for value, raw for the others; "all" every
            score the target has, from one set of forward passes. A ratio or normalized curve is
            NaN for a state where it would divide by about 0 (a clean score <= 0 for ratio, or a
            curve beyond 100 in magnitude), with a RuntimeWarning.
        key (jax.Array | None): PRNG key of the "random" substrate; the state in row i of `obs`
            gets the substrate drawn from `jax.random.fold_in(key, i)` (same key and row, same
            substrate). Unused by the other substrates.
        target (str | Callable): the scalar followed, as in `jaxsal.explain`. A policy target
            (policy_logit, log_prob, or a Q target on a dict output with logits and no Q-values)
            is followed as the action's probability pi(a|x_t): logits are defined only up to a
            per-state constant.
        actions (jax.Array | None): (N,) actions followed (needed by "q_action"); None: the
            target's choice on the clean input (`jaxsal.targets.resolve_actions`).
        batch_size (int | None): model rows (states x (S + 1)) per forward pass; None: the
            backend's default.
        layout (str): "NHWC" (default) or "NCHW", the layout of `obs`.
        pixel_range (tuple[float, float]): (low, high) of the "random" substrate.
        blur_sigma (float): the "blur" substrate's sigma in pixels.

    Returns:
        dict: `{"auc": jax.Array (N,), "curves": jax.Array (N, S + 1), "score": str (the score
            used), "actions": jax.Array (N,) (the actions followed)}`; the AUC is the mean of the
            curve. With `score="all"`: `{score: {"auc": (N,), "curves": (N, S + 1)}}` for every
            score the target has (NaN marks each score's undefined states, without a warning).

    Raises:
        jaxsal.SaliencyInputError: an unknown `substrate` or `score`; "q_value" or "advantage"
            for a target without Q-values; "random" without `key`; `maps` not (N, H, W) for the
            N states or not finite; a bad `pixels_per_step`, `blur_sigma` or `pixel_range`; or a
            bad call (obs, target, actions, layout), as `jaxsal.explain` reports it.
    """
    return _curves("insertion", apply_fn, params, obs, maps, substrate, pixels_per_step, score,
                   key, target, actions, batch_size, layout, pixel_range, blur_sigma)


def deletion(apply_fn, params, obs, maps, substrate: str = "black", pixels_per_step: int = 84,
             score: str = "auto", key=None, *, target="q_chosen", actions=None,
             batch_size: int | None = None, layout: str = "NHWC", pixel_range=(0.0, 255.0),
             blur_sigma: float = 5.0):
    """Deletion curves, the mirror of `insertion`: does the score collapse fast when the most
    salient pixels are removed first? Lower AUC = more faithful map.

    The curve starts from the clean input x and replaces its pixels by the substrate in order of
    decreasing saliency until every pixel is substrate (x_0, its last step); targets, scores and
    arguments are those of `insertion`.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output`.
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) with
            `layout="NCHW"`.
        maps (jax.Array | numpy.ndarray): one saliency map per state, (N, H, W), finite.
        substrate (str): what removed pixels become: "black" (default), "random" (needs `key`)
            or "blur", as in `insertion`.
        pixels_per_step (int): pixels removed per step.
        score (str): the curve's score, as in `insertion`.
        key (jax.Array | None): PRNG key of the "random" substrate (per row of `obs`, as in
            `insertion`).
        target (str | Callable): the scalar followed, as in `insertion`.
        actions (jax.Array | None): (N,) actions followed; None: the target's choice on the
            clean input.
        batch_size (int | None): model rows per forward pass; None: the backend's default.
        layout (str): "NHWC" (default) or "NCHW", the layout of `obs`.
        pixel_range (tuple[float, float]): (low, high) of the "random" substrate.
        blur_sigma (float): the "blur" substrate's sigma in pixels.

    Returns:
        dict: `{"auc": jax.Array (N,), "curves": jax.Array (N, S + 1), "score": str,
            "actions": jax.Array (N,)}`, or with `score="all"` `{score: {"auc", "curves"}}`, as
            `insertion` returns.

    Raises:
        jaxsal.SaliencyInputError: on the inputs `insertion` refuses.
    """
    return _curves("deletion", apply_fn, params, obs, maps, substrate, pixels_per_step, score,
                   key, target, actions, batch_size, layout, pixel_range, blur_sigma)
