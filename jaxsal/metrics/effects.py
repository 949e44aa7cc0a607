"""Object-level causal effects: what the agent's output does when a game object is removed, and
how well a map's object shares predict it.

    eff = jaxsal.metrics.object_effects(apply_fn, params, obs, boxes)   # boxes: ObjectBoxes or masks
    eff.effect[:, eff.classes.index("ball")]    # Q_a(x) - Q_a(x without the ball), a = argmax Q_a(x)
    eff.flips                                   # (N, C) bool: removing the class changes the greedy action
    agr = jaxsal.metrics.effect_agreement(jaxsal.metrics.object_attribution(maps, boxes), eff,
                                          groups=episode_ids)

`object_effects` removes one class at a time from every stacked frame: the pixels of its masks
are replaced by the fill (by default the frame's own background, the most frequent pixel value
outside all object masks of that frame). All states x classes run as one batched forward pass
per chunk on device (the original state is the chunk's extra row), eagerly or inside the
caller's jit. `effect_agreement` rank-correlates shares with effects within each state (across
classes) and across states (per class), with percentile intervals from resampling the caller's
units (episodes), never single consecutive states unless the caller says so.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxsal import targets as T
from jaxsal.batching import cached_jit, is_traced, map_batched
from jaxsal.errors import SaliencyInputError
from jaxsal.checks import LAYOUTS, check_obs, target_actions

FILLS = ("background",)


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["effect", "flips", "score", "actions", "present"],
                   meta_fields=["classes"])
@dataclasses.dataclass(frozen=True)
class ObjectEffects:
    """Per state and class (N, C): `effect` = explained output of the original state minus that of
    the state without the class (for the action explained in the original state); `flips` =
    the greedy action changes; `present` = the class has pixels in some stacked frame (an absent
    class changes nothing: effect 0). `score` (N,) and `actions` (N,): the original state's
    explained output and action."""
    effect: jax.Array
    flips: jax.Array
    score: jax.Array
    actions: jax.Array
    present: jax.Array
    classes: tuple = ()


def _mode(values, valid):
    """Most frequent value of `values` (P,) among `valid` (P,) (all values when none is valid);
    ties go to the smallest value. Sort-based (any float or integer frames): the longest run of
    equal values in the sorted pixels."""
    valid = jnp.where(valid.any(), valid, True)
    s = jnp.sort(jnp.where(valid, values, jnp.inf))
    i = jnp.arange(s.shape[0])
    start = jnp.concatenate([jnp.ones(1, bool), s[1:] != s[:-1]])
    first = jax.lax.cummax(jnp.where(start, i, 0))                      # where each pixel's run begins
    last = jnp.concatenate([start[1:], jnp.ones(1, bool)])
    return s[jnp.argmax(jnp.where(last & jnp.isfinite(s), i - first + 1, 0))]


def _mode_uint8(values, valid):
    """`_mode` for pixels 0..255 from a 256-bin histogram (~30x faster than sorting on CPU)."""
    valid = jnp.where(valid.any(), valid, True)
    hist = jnp.zeros(256, jnp.float32).at[values.astype(jnp.int32)].add(valid.astype(jnp.float32))
    return jnp.argmax(hist).astype(values.dtype)


def background(x, masks, uint8: bool = False):
    """Per state and stacked frame, the background value: the mode of the frame's pixels outside
    every object mask of that frame (ties: the smallest value). x (B, H, W, F) float, masks
    (B, F, C, H, W) bool -> (B, F). uint8=True: x holds integers 0..255 (a histogram, faster)."""
    b, h, w, f = x.shape
    vals = jnp.moveaxis(x, -1, 1).reshape(b * f, h * w)
    outside = ~masks.any(2).reshape(b * f, h * w)
    return jax.vmap(_mode_uint8 if uint8 else _mode)(vals, outside).reshape(b, f)


def _build(apply_fn, target_name, layout: str, fill_mode: str, num_classes, height: int, width: int,
           uint8: bool = False):
    """Chunk function (params, obs, mask source..., [fill]) -> (effect, flips, score, actions, present).

    fill_mode: "background" (estimated here) or "given" (a (B, H, W, F) fill image is the last
    argument). Mask source: (boxes, labels) when num_classes is an int, else masks (B, F, C, H, W)."""
    from jaxsal.objects.boxes import boxes_to_masks

    target = T.get_target(target_name)
    choose = target.choose if T.explains_action(target) else (lambda o: jnp.argmax(T.q_of(o), -1))

    def fn(params, obs, *rest):
        if num_classes is not None:
            boxes, labels, rest = rest[0], rest[1], rest[2:]
            masks = boxes_to_masks(boxes, labels, num_classes, height, width)
        else:
            masks, rest = rest[0], rest[1:]
        actions = rest[-1]
        x = obs.astype(jnp.float32)
        x = x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))       # (B, H, W, F)
        b, c = x.shape[0], masks.shape[2]
        if fill_mode == "background":
            fill = jnp.broadcast_to(background(x, masks, uint8)[:, None, None, :], x.shape)
        else:
            fill = rest[0].astype(jnp.float32)
        m = jnp.transpose(masks, (0, 2, 3, 4, 1))                           # (B, C, H, W, F)
        xi = jnp.where(m, fill[:, None], x[:, None])                        # (B, C, H, W, F)
        rows = jnp.concatenate([x[:, None], xi], 1).reshape((b * (c + 1),) + x.shape[1:])
        if layout == "NCHW":
            rows = jnp.transpose(rows, (0, 3, 1, 2))
        out = apply_fn(params, rows)
        out = jax.tree.map(lambda o: o.reshape((b, c + 1) + o.shape[1:]), out)
        orig = jax.tree.map(lambda o: o[:, 0], out)
        a = jnp.where(actions >= 0, actions, jax.lax.stop_gradient(target.choose(orig))).astype(jnp.int32)
        flat = jax.tree.map(lambda o: o.reshape((b * (c + 1),) + o.shape[2:]), out)
        scores = target.score(flat, jnp.repeat(a, c + 1)).reshape(b, c + 1)
        greedy = choose(flat).reshape(b, c + 1)
        return (scores[:, :1] - scores[:, 1:], greedy[:, 1:] != greedy[:, :1], scores[:, 0], a,
                masks.any((1, 3, 4)))
    return fn


def _fill_image(fill, shape, layout: str, n: int):
    """A numeric fill -> (N, H, W, F) float32 (shape: the NHWC obs shape)."""
    _, h, w, f = shape
    v = jnp.asarray(fill, jnp.float32)
    per_state = tuple(shape[1:]) if layout == "NHWC" else (f, h, w)
    if v.ndim == 0:
        return jnp.full(shape, v)
    if v.ndim == 1 and v.shape[0] == f:
        return jnp.broadcast_to(v, shape)
    if v.ndim == 2 and v.shape == (n, f):
        return jnp.broadcast_to(v[:, None, None, :], shape)
    if v.shape in (per_state, (n,) + per_state):
        v = v if layout == "NHWC" else jnp.moveaxis(v, -3, -1)
        return jnp.broadcast_to(v, shape)
    obs_shape = tuple(shape) if layout == "NHWC" else (n,) + per_state
    raise SaliencyInputError(
        f"fill of shape {tuple(v.shape)} does not fit obs of shape {obs_shape}"
        f": pass fill='background', a number, one value per stacked frame ({f},), per state and frame "
        f"({n}, {f}), or a background image of one state {per_state} or of every state")


def object_effects(apply_fn, params, obs, boxes_or_masks, target="q_chosen", fill="background", classes=None,
                   batch_size: int = 256, *, actions=None, layout: str = "NHWC") -> ObjectEffects:
    """Causal effect of removing each object class from each state (module doc).

    obs: (N, H, W, F) frame stacks (the channels are the stacked frames; layout="NCHW" for
    (N, F, H, W)). boxes_or_masks: `jaxsal.objects.ObjectBoxes`, bool masks (N, F, C, H, W) per
    stacked frame, or (N, C, H, W) used for every frame; classes: names (taken from ObjectBoxes).
    For class c, every pixel of c's masks in frame f is set to the fill of frame f, in all frames
    at once. fill: "background" = per state and frame, the most frequent pixel value outside all
    object masks of that frame (the whole frame's if masks cover it all); or a number, one value
    per stacked frame (F,), per state and frame (N, F), or a background image of one state
    (obs.shape[1:]) or of every state (obs.shape), e.g. the game's empty screen.

    target: what is explained (`jaxsal.targets`); its action is fixed on the original state
    (argmax, or `actions`), so `effect[i, c]` = target(x_i)_a - target(x_i without c)_a: positive
    when removing c lowers the output. `flips[i, c]`: the greedy action (argmax of the Q-values,
    or of the logits for policy targets) differs without c. batch_size: model rows per forward
    pass; a chunk holds batch_size // (C + 1) states (at least one: C + 1 rows). Batch-independent,
    so chunking never changes a result; works under jax.jit (pass masks as an array then,
    or an ObjectBoxes closed over)."""
    from jaxsal.objects.boxes import ObjectBoxes

    if layout not in LAYOUTS:
        raise SaliencyInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    x = check_obs(obs, layout)
    nhwc = x.shape if layout == "NHWC" else (x.shape[0], x.shape[2], x.shape[3], x.shape[1])
    n, h, w, f = nhwc
    if isinstance(fill, str):
        if fill not in FILLS:
            raise SaliencyInputError(f"unknown fill {fill!r}: pass fill='background' (each frame's own "
                                     "background), a number, or an array of background values")
        fill_mode = "background"
    else:
        fill_mode = "given"
    traced = is_traced(params, obs, boxes_or_masks)

    if isinstance(boxes_or_masks, ObjectBoxes):
        ob = boxes_or_masks
        if (ob.height, ob.width) != (h, w):
            raise SaliencyInputError(f"boxes are for {ob.height}x{ob.width} frames, obs are {h}x{w}")
        if ob.boxes.shape[1] != f or len(ob) != n:
            raise SaliencyInputError(f"boxes are for {len(ob)} states of {ob.boxes.shape[1]} stacked frames, "
                                     f"obs has {n} states of {f} frames (one stacked frame per channel)")
        names = tuple(classes) if classes else ob.classes
        c = len(ob.classes)
        sources = [jnp.asarray(ob.boxes), jnp.asarray(ob.labels)]
        num_classes = c
    else:
        masks = jnp.asarray(boxes_or_masks)
        if masks.ndim == 4:
            masks = jnp.broadcast_to(masks[:, None], (masks.shape[0], f) + masks.shape[1:])
        if masks.ndim != 5 or masks.shape[0] != n or masks.shape[1] != f or masks.shape[3:] != (h, w):
            raise SaliencyInputError(
                f"masks must be bool (N, F, C, H, W) = ({n}, {f}, C, {h}, {w}) per stacked frame, (N, C, H, W) "
                f"for every frame, or ObjectBoxes; got shape {tuple(np.shape(boxes_or_masks))}")
        c = masks.shape[2]
        names = tuple(classes) if classes else tuple(f"class_{i}" for i in range(c))
        sources = [masks.astype(bool)]
        num_classes = None
    if len(names) != c:
        raise SaliencyInputError(f"{len(names)} class names for {c} mask classes")
    if c == 0:
        raise SaliencyInputError("no object classes to remove (C = 0)")
    if fill_mode == "given":
        sources.append(_fill_image(fill, (n, h, w, f), layout, n))
    tgt = T.get_target(target)
    if actions is None:
        target_actions(tgt, None, n, None)  # q_action: the caller's actions are needed
        acts = jnp.full((n,), -1, jnp.int32)
    elif traced:
        acts = T.check_actions(actions, n, None)
    else:
        q_shape = jax.eval_shape(lambda p, o: T.q_of(apply_fn(p, o)), params, x[:1]).shape
        acts = jnp.asarray(T.check_actions(actions, n, q_shape[-1]))
    dtype = np.dtype(obs.dtype if hasattr(obs, "dtype") else np.asarray(obs).dtype)
    fn = cached_jit(_build, apply_fn, target, layout, fill_mode, num_classes, h, w, dtype in (np.uint8, np.bool_))
    eff, flips, score, a, present = map_batched(fn, params, x, *sources, acts, batch_size=batch_size,
                                                rows_per_state=c + 1)
    return ObjectEffects(effect=eff, flips=flips, score=score, actions=a, present=present, classes=names)


def _spearman(a, b) -> float:
    """Spearman rank correlation of the finite pairs of a and b (average ranks); NaN with fewer
    than two pairs or when either side is constant."""
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 2:
        return float("nan")
    return float(_weighted_spearman(a[ok], b[ok], np.ones((1, int(ok.sum()))))[0])


def _weighted_ranks(v, w):
    """Average ranks (1-based) of v (n,) in the sample holding w[r, i] copies of v[i]: row r of
    (R, n). A value's rank is (copies of smaller values) + (copies of equal values + 1) / 2,
    what `scipy.stats.rankdata` gives the expanded sample."""
    _, inv = np.unique(v, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(inv[order]) != 0])
    group = np.add.reduceat(w[:, order], starts, axis=1)                # (R, G) copies per tie group
    rank = np.cumsum(group, 1) - group + (group + 1.0) / 2.0
    return rank[:, inv]


def _weighted_spearman(a, b, w):
    """(R,) Spearman correlations of the samples holding w[r, i] copies of the pair (a[i], b[i])
    (bootstrap resamples as counts: one sort for all of them); NaN where a side is constant."""
    ra, rb = _weighted_ranks(a, w), _weighted_ranks(b, w)
    tot = w.sum(1, keepdims=True)
    ra = ra - (w * ra).sum(1, keepdims=True) / tot
    rb = rb - (w * rb).sum(1, keepdims=True) / tot
    cov, va, vb = (w * ra * rb).sum(1), (w * ra * ra).sum(1), (w * rb * rb).sum(1)
    den = np.sqrt(va * vb)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 1e-12 * np.maximum(tot[:, 0], 1) ** 3, cov / den, np.nan)


def effect_agreement(shares, effects, groups=None, n_resamples: int = 2000, seed: int = 0, level: float = 0.95,
                     share: str = "positive") -> dict:
    """How well a map's object shares predict the causal effects of removing the objects.

    shares: `ObjectShares` (its `share` field: "positive" or "absolute") or (N, C) numbers;
    effects: `ObjectEffects` or (N, C) numbers, the same states and classes. A (state, class)
    pair where the class is absent (either result's `present` is False) or a value is NaN is
    left out.

    - within_state: per state, the Spearman rank correlation across classes of share and
      effect (NaN for a state with fewer than two classes or constant shares or effects:
      left out), averaged over states. 1 = the map ranks every state's objects as removing them
      does.
    - across_states: per class, the Spearman correlation across states of its share and its
      effect (NaN when either is constant, e.g. a class the agent ignores: effect 0 everywhere).

    Intervals: percentile bootstrap over the caller's units `groups` (N,) (e.g. episode ids):
    each resample draws as many units as there are, with replacement, and keeps all their
    states. Consecutive states of one episode are dependent, so pass episodes (or blocks of
    consecutive states, `jaxsal.metrics.statistics.blocks`) as units. groups=None makes each
    state its own unit: only right when the states are independent samples.

    Returns {"within_state": {"mean", "low", "high", "states"}, "across_states": {class:
    {"rho", "low", "high", "states"}}, "units", "level", "share"}."""
    from jaxsal.metrics.objects import ObjectShares

    present = None
    names = None
    if isinstance(shares, ObjectShares):
        if share not in ("positive", "absolute"):
            raise SaliencyInputError(f"share must be 'positive' or 'absolute', got {share!r}")
        present, names = np.asarray(shares.present, bool), shares.classes
        s = np.asarray(getattr(shares, share), np.float64)
    else:
        s = np.asarray(shares, np.float64)
    if isinstance(effects, ObjectEffects):
        e = np.asarray(effects.effect, np.float64)
        p = np.asarray(effects.present, bool)
        if present is not None and p.shape == present.shape:
            if names != effects.classes:
                raise SaliencyInputError(f"shares are for classes {names}, effects for {effects.classes}: "
                                         "score both on the same boxes (or pass the same classes=)")
            p = present & p
        present, names = p, effects.classes
    else:
        e = np.asarray(effects, np.float64)
    if s.ndim != 2 or s.shape != e.shape:
        raise SaliencyInputError(f"shares and effects must both be (N, C) for the same states and classes, "
                                 f"got {s.shape} and {e.shape}")
    n, c = s.shape
    names = tuple(names) if names else tuple(f"class_{i}" for i in range(c))
    if present is not None:
        if present.shape != s.shape:
            raise SaliencyInputError(f"shares are for {present.shape} (states, classes), effects for {s.shape}")
        s, e = np.where(present, s, np.nan), np.where(present, e, np.nan)
    if groups is None:
        unit = np.arange(n)
    else:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise SaliencyInputError(f"groups must give one unit id per state, shape ({n},), got {g.shape}")
        unit = np.unique(g, return_inverse=True)[1].reshape(n)
    k = int(unit.max()) + 1
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise SaliencyInputError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not 0 < level < 1:
        raise SaliencyInputError(f"level must be in (0, 1), got {level!r}")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, k, (int(n_resamples), k))
    alpha = (1.0 - level) / 2.0

    def interval(boot):
        boot = boot[np.isfinite(boot)]
        if not len(boot):
            return float("nan"), float("nan")
        lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
        return float(lo), float(hi)

    r = np.array([_spearman(s[i], e[i]) for i in range(n)])
    ok = np.isfinite(r)
    sums = np.bincount(unit, np.where(ok, r, 0.0), k)
    n_ok = np.bincount(unit, ok.astype(np.float64), k)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = sums[pick].sum(1) / n_ok[pick].sum(1)
    lo, hi = interval(boot)
    within = {"mean": float(r[ok].mean()) if ok.any() else float("nan"), "low": lo, "high": hi,
              "states": int(ok.sum())}
    across = {}
    counts = np.bincount((np.arange(len(pick))[:, None] * k + pick).ravel(), minlength=len(pick) * k)
    counts = counts.reshape(len(pick), k).astype(np.float64)             # (R, units): copies of each unit
    for j, name in enumerate(names):
        ok = np.isfinite(s[:, j]) & np.isfinite(e[:, j])
        rho = _spearman(s[:, j], e[:, j])
        boot = np.array([])
        if np.isfinite(rho):      # resamples as per-state copy counts, in slices of 256 (memory: 256 x N)
            boot = np.concatenate([_weighted_spearman(s[ok, j], e[ok, j], counts[r:r + 256][:, unit[ok]])
                                   for r in range(0, len(pick), 256)])
        lo, hi = interval(boot)
        across[name] = {"rho": rho, "low": lo, "high": hi, "states": int(ok.sum())}
    return {"within_state": within, "across_states": across, "units": k, "level": level, "share": share}
