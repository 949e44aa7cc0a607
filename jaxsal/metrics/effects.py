"""Object-level causal effects: what the agent's output does when a game object is removed, and
how well a map's object shares predict it.

    eff = jaxsal.metrics.object_effects(apply_fn, params, obs, boxes)   # boxes: ObjectBoxes or masks
    eff.effect[:, eff.classes.index("ball")]    # Q_a(x) - Q_a(x without the ball), a = argmax Q_a(x)
    eff.flips                                   # (N, C) bool: removing the class changes the greedy action
    agr = jaxsal.metrics.effect_agreement(jaxsal.metrics.object_attribution(maps, boxes), eff,
                                          groups=episode_ids)

`object_effects` removes one class at a time, from every stacked frame (frames="all") or the
newest (frames="newest"): its pixels that lie in no other class's box are replaced by the fill (by
default the median of a ring around each box, outside all objects: a local background), and it
reports per removal how much of the class overlapped other objects (kept) and how many
non-background pixels were left just around its boxes (residue). All states x classes run as one batched forward pass
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
from jaxsal.batching import is_traced, map_batched
from jaxsal.caching import cached_jit
from jaxsal.errors import SaliencyInputError
from jaxsal.checks import LAYOUTS, check_obs, check_positive_int, num_actions, output_shape, target_actions

FILLS = ("ring", "background")
FRAMES = ("all", "newest")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["effect", "flips", "score", "actions", "present", "overlap", "residue",
                                "residue_share"],
                   meta_fields=["classes", "frames", "fill"])
@dataclasses.dataclass(frozen=True)
class ObjectEffects:
    """What `object_effects` gives: per state and class, what removing the class did to the
    explained output.

    Attributes:
        effect (jax.Array): (N, C) the explained output of the original state minus that of the
            state without the class, for the action explained in the original state (an absent
            class changes nothing: 0).
        flips (jax.Array): (N, C) bool, the greedy action changes without the class.
        score (jax.Array): (N,) the original state's explained output.
        actions (jax.Array): (N,) the action explained in each original state.
        present (jax.Array): (N, C) bool, the class has pixels in a frame it is removed from.
        overlap (jax.Array): (N, C) the share of the class's box pixels (in the removed frames)
            that also lie in another class's box, so were kept (1: nothing was removed; NaN when
            absent).
        residue (jax.Array): (N, C) int, pixels that are not background after the fill in the
            class's boxes grown by `margin` px (other classes' boxes left out), e.g. a moving
            ball's pixels outside its RAM box.
        residue_share (jax.Array): (N, C) the residue's share of those pixels (NaN when absent).
        classes (tuple[str, ...]): the C class names, in column order.
        frames (str): "all" or "newest", the frames the classes were removed from.
        fill (str): "ring", "background" or "given", how removed pixels were filled.
    """
    effect: jax.Array
    flips: jax.Array
    score: jax.Array
    actions: jax.Array
    present: jax.Array
    overlap: jax.Array = None
    residue: jax.Array = None
    residue_share: jax.Array = None
    classes: tuple = ()
    frames: str = "all"
    fill: str = "ring"


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


def _expand(boxes, valid, d: int, h: int, w: int):
    """(B, F, K, 4) half-open boxes grown by d px on every side (clipped to the frame) -> (B, F, K, H*W)
    bool; slots that are not `valid` (padding, empty boxes) stay empty."""
    b = boxes.astype(jnp.int32)
    rows = (jnp.arange(h) >= b[..., 0:1] - d) & (jnp.arange(h) < b[..., 2:3] + d)
    cols = (jnp.arange(w) >= b[..., 1:2] - d) & (jnp.arange(w) < b[..., 3:4] + d)
    grown = rows[..., :, None] & cols[..., None, :] & valid[..., None, None]
    return grown.reshape(grown.shape[:-2] + (h * w,))


def _dilate(m, d: int, h: int, w: int):
    """(B, F, K, H*W) bool masks dilated by d px (a (2d + 1)^2 square: what growing a box by d gives)."""
    if d == 0:
        return m
    g = m.reshape(m.shape[:-1] + (h, w)).astype(jnp.float32)
    g = jax.lax.reduce_window(g, 0.0, jax.lax.max, (1,) * (g.ndim - 2) + (2 * d + 1, 2 * d + 1),
                              (1,) * g.ndim, "SAME")
    return (g > 0).reshape(m.shape)


def _per_class(onehot, regions):
    """Regions (B, F, K, P) bool of classes onehot (B, F, K, C) -> (B, F, C, P) bool: in some region of c."""
    return jnp.einsum("bfkc,bfkp->bfcp", onehot.astype(jnp.float32), regions.astype(jnp.float32)) > 0


def _ring_stats(x, ring, mode, uint8: bool):
    """Per region: the median, minimum and maximum of x (B, F, P) over its ring (B, F, K, P) bool;
    the frame's background `mode` (B, F) where a ring is empty. Median of an even count: the mean of
    the two middle values (numpy's). uint8 frames: by bisection over 0..255 (no sort)."""
    n = ring.sum(-1)
    xs = x[:, :, None, :]
    lo_v = jnp.min(jnp.where(ring, xs, jnp.inf), -1)
    hi_v = jnp.max(jnp.where(ring, xs, -jnp.inf), -1)
    ranks = jnp.stack([(n - 1) // 2, n // 2], -1)                        # the two middle order statistics
    if uint8:
        a, b = jnp.zeros_like(ranks), jnp.full_like(ranks, 255)
        xu = jnp.where(ring, xs, 256.0).astype(jnp.int16)[..., None, :]  # off the ring: above every t
        for _ in range(8):                                                # smallest t with > rank values <= t
            mid = (a + b) // 2
            cnt = (xu <= mid[..., None].astype(jnp.int16)).sum(-1, dtype=jnp.int32)
            ok = cnt > ranks
            a, b = jnp.where(ok, a, mid + 1), jnp.where(ok, mid, b)
        mid_v = a.astype(jnp.float32)
    else:
        s = jnp.sort(jnp.where(ring, xs, jnp.inf), -1)
        mid_v = jnp.take_along_axis(s, jnp.clip(ranks, 0, s.shape[-1] - 1), -1)
    med = mid_v.mean(-1)
    empty = n == 0
    m = mode[:, :, None]
    return jnp.where(empty, m, med), jnp.where(empty, m, lo_v), jnp.where(empty, m, hi_v)


def removals(x, fill_mode: str, frames: str, margin: int, ring_width: int, uint8: bool, *, masks=None,
             boxes=None, labels=None, num_classes=None, fill=None):
    """The frames with each class removed, and what the removal did (pure, batched over states).

    x (B, H, W, F) float; the objects as boxes (B, F, K, 4) + labels (B, F, K) of num_classes
    classes, or as masks (B, F, C, H, W) bool (each class's mask one region). Class c's pixels
    that lie in no other class's region are set to the fill, in the removed frames (`frames`).
    fill_mode: "ring" (per region, the median of the pixels `margin` .. `margin + ring_width` px
    outside it and outside every object grown by `margin`), "background" (per frame, the mode
    outside all objects) or "given" (fill (B, H, W, F)). Returns (xi (B, C, H, W, F), masks
    (B, F, C, H, W), present, overlap, residue, residue_share), the last four (B, C)."""
    b, h, w, f = x.shape
    xf = jnp.moveaxis(x, -1, 1).reshape(b, f, h * w)                     # (B, F, P)
    if masks is None:
        valid = (labels >= 0) & (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
        onehot = (labels[..., None] == jnp.arange(num_classes)) & valid[..., None]   # (B, F, K, C)
        region = _expand(boxes, valid, 0, h, w)
        grown = _expand(boxes, valid, margin, h, w)
        outer = _expand(boxes, valid, margin + ring_width, h, w) if fill_mode == "ring" else None
    else:
        c = masks.shape[2]
        onehot = jnp.broadcast_to(jnp.eye(c, dtype=bool), (b, f, c, c))
        region = masks.reshape(b, f, c, h * w)
        grown = _dilate(region, margin, h, w)
        outer = _dilate(region, margin + ring_width, h, w) if fill_mode == "ring" else None
    cls = _per_class(onehot, region)                                      # (B, F, C, P)
    others = (cls.sum(2, keepdims=True) - cls) > 0                        # in another class's region
    sel = (jnp.arange(f) == f - 1) if frames == "newest" else jnp.ones(f, bool)
    sel = sel[None, :, None, None]
    rm = cls & ~others & sel                                              # what is filled
    mode = background(x, cls.reshape(b, f, -1, h, w), uint8)              # (B, F)
    if fill_mode == "ring":
        ring = outer & ~grown.any(2, keepdims=True)
        med, lo_k, hi_k = _ring_stats(xf, ring, mode, uint8)              # (B, F, K)
        oh = onehot.astype(jnp.float32)
        num = jnp.einsum("bfkc,bfkp->bfcp", oh * med[..., None], region.astype(jnp.float32))
        den = jnp.einsum("bfkc,bfkp->bfcp", oh, region.astype(jnp.float32))
        value = jnp.where(den > 0, num / jnp.maximum(den, 1.0), mode[:, :, None, None])   # (B, F, C, P)
        has = onehot.any(2)                                               # (B, F, C): c has a region
        lo = jnp.where(has, jnp.min(jnp.where(onehot, lo_k[..., None], jnp.inf), 2), mode[..., None])[..., None]
        hi = jnp.where(has, jnp.max(jnp.where(onehot, hi_k[..., None], -jnp.inf), 2), mode[..., None])[..., None]
    elif fill_mode == "background":
        value = lo = hi = mode[:, :, None, None]
    else:
        value = lo = hi = jnp.moveaxis(fill.astype(jnp.float32), -1, 1).reshape(b, f, 1, h * w)
    xi = jnp.where(rm, value, xf[:, :, None])                             # (B, F, C, P)
    area = (cls & sel).sum((1, 3))                                        # (B, C) box pixels removed from
    overlap = jnp.where(area > 0, (cls & others & sel).sum((1, 3)) / jnp.maximum(area, 1), jnp.nan)
    near = _per_class(onehot, grown) & ~others & sel                      # the grown boxes, others' pixels out
    left = near & ((xi < lo) | (xi > hi))                                 # not background after the fill
    residue = left.sum((1, 3)).astype(jnp.int32)
    span = near.sum((1, 3))
    share = jnp.where(span > 0, residue / jnp.maximum(span, 1), jnp.nan)
    xi = jnp.transpose(xi.reshape(b, f, -1, h, w), (0, 2, 3, 4, 1))       # (B, C, H, W, F)
    return (xi, cls.reshape(b, f, -1, h, w), area > 0, overlap.astype(jnp.float32), residue,
            share.astype(jnp.float32))


def _build(apply_fn, target_name, layout: str, fill_mode: str, num_classes, height: int, width: int,
           uint8: bool = False, frames: str = "all", margin: int = 2, ring_width: int = 3):
    """Chunk function (params, obs, mask source..., [fill], actions) -> (effect, flips, score, actions,
    present, overlap, residue, residue_share).

    fill_mode: "ring" or "background" (estimated here) or "given" (a (B, H, W, F) fill image is the
    argument before the actions). Mask source: (boxes, labels) when num_classes is an int, else masks
    (B, F, C, H, W)."""
    target = T.get_target(target_name)

    def fn(params, obs, *rest):
        if num_classes is not None:
            src = {"boxes": rest[0], "labels": rest[1], "num_classes": num_classes}
            rest = rest[2:]
        else:
            src = {"masks": rest[0]}
            rest = rest[1:]
        actions = rest[-1]
        x = obs.astype(jnp.float32)
        x = x if layout == "NHWC" else jnp.transpose(x, (0, 2, 3, 1))       # (B, H, W, F)
        xi, masks, present, overlap, residue, share = removals(
            x, fill_mode, frames, margin, ring_width, uint8, fill=rest[0] if fill_mode == "given" else None, **src)
        b, c = x.shape[0], masks.shape[2]
        rows = jnp.concatenate([x[:, None], xi], 1).reshape((b * (c + 1),) + x.shape[1:])
        if layout == "NCHW":
            rows = jnp.transpose(rows, (0, 3, 1, 2))
        out = apply_fn(params, rows)
        out = jax.tree.map(lambda o: o.reshape((b, c + 1) + o.shape[1:]), out)
        orig = jax.tree.map(lambda o: o[:, 0], out)
        a = jnp.where(actions >= 0, actions, T.greedy(target, orig))
        flat = jax.tree.map(lambda o: o.reshape((b * (c + 1),) + o.shape[2:]), out)
        scores = target.score(flat, jnp.repeat(a, c + 1)).reshape(b, c + 1)
        greedy = T.greedy(target, flat, agent=True).reshape(b, c + 1)
        return (scores[:, :1] - scores[:, 1:], greedy[:, 1:] != greedy[:, :1], scores[:, 0], a,
                present, overlap, residue, share)
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


def object_effects(apply_fn, params, obs, boxes_or_masks, target="q_chosen", fill="ring", classes=None,
                   batch_size: int = 256, *, actions=None, layout: str = "NHWC", frames: str = "all",
                   margin: int = 2, ring_width: int = 3) -> ObjectEffects:
    """Causal effect of removing each object class from each state: how much the explained
    output drops without it, and whether the greedy action changes.

    Class c's pixels in the removed frames that lie in no other class's box are set to the fill
    (other objects are never painted over; `overlap` says how much of c was kept so). Removing
    c from every frame (`frames="all"`) shows the agent a state without c, one it can meet in
    play (Breakout's "no ball" is the state before a serve): "what does the agent do when c is
    not there". Removing it from the newest frame only shows a stack where c has just vanished,
    one the agent never saw: "does the newest frame's c matter given the history". Neither
    isolates "uses c's position": moving c does. All states x classes run as one batched
    forward pass per chunk; batch-independent (chunking never changes a result), and usable
    under `jax.jit` (pass masks as an array, or an ObjectBoxes closed over).

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output`.
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): frame stacks (N, H, W, F), the channels being the
            stacked frames; (N, F, H, W) with `layout="NCHW"`.
        boxes_or_masks (jaxsal.game_objects.ObjectBoxes | jax.Array | numpy.ndarray): the objects:
            ObjectBoxes, bool masks (N, F, C, H, W) per stacked frame (boxes, or pixel-level
            object masks where those are known: then only object pixels are filled), or
            (N, C, H, W) used for every frame.
        target (str | Callable): what is explained (`jaxsal.targets`); its action is fixed on
            the original state.
        fill (str | float | jax.Array | numpy.ndarray): what removed pixels become: "ring"
            (default; per box and frame, the median of a ring `ring_width` px wide, `margin` px
            outside the box and outside every object box grown by `margin`: a local background,
            right on textured screens as on black ones; the frame's mode where the ring is
            empty), "background" (per state and frame, the most frequent pixel value outside all
            object boxes), or values: a number, one per stacked frame (F,), per state and frame
            (N, F), or a background image of one state (obs.shape[1:]) or of every state
            (obs.shape), e.g. the game's empty screen.
        classes (Sequence[str] | None): the C class names; None takes them from ObjectBoxes (or
            names them "class_0", ...).
        batch_size (int): model rows per forward pass; a chunk holds batch_size // (C + 1)
            states (at least one).
        actions (jax.Array | None): (N,) actions whose output is compared (needed by
            "q_action"); None: the target's choice on the original state.
        layout (str): "NHWC" (default) or "NCHW", the layout of `obs`.
        frames (str): "all" (default) removes c from every stacked frame, "newest" from the
            newest (last) frame only.
        margin (int): pixels between a box and its ring, and by which boxes grow for the
            residue (RAM boxes are of one sub-frame; frames are resized and max-pooled over
            two).
        ring_width (int): the ring's width in pixels.

    Returns:
        ObjectEffects: per state and class (N, C): `effect` = target(x)_a - target(x without
            c)_a (positive when removing c lowers the output), `flips` (the greedy action, argmax
            of the Q-values or of the logits for policy targets, differs without c), `present`,
            and what each removal did: `overlap` (the share of c's box pixels kept because
            another class's box covers them), `residue` (pixels of c's boxes grown by `margin`
            that are not background after the fill) and `residue_share`; `score` (N,) and
            `actions` (N,) of the original state; `classes`, `frames` and `fill` ("ring",
            "background" or "given").

    Raises:
        jaxsal.SaliencyInputError: an unknown `layout`, `fill` or `frames`; a `margin` or
            `ring_width` that is not a non-negative (positive) integer; boxes or masks that do
            not fit `obs` (frame size, states, stacked frames); class names that do not match;
            no classes; a fill array of another shape; bad `actions` or `obs`.
    """
    from jaxsal.game_objects.boxes import ObjectBoxes

    if layout not in LAYOUTS:
        raise SaliencyInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    x = check_obs(obs, layout)
    nhwc = x.shape if layout == "NHWC" else (x.shape[0], x.shape[2], x.shape[3], x.shape[1])
    n, h, w, f = nhwc
    if isinstance(fill, str):
        if fill not in FILLS:
            raise SaliencyInputError(f"unknown fill {fill!r}: pass fill='ring' (the median around each box), "
                                     "fill='background' (each frame's own background), a number, or an array "
                                     "of background values")
        fill_mode = fill
    else:
        fill_mode = "given"
    if frames not in FRAMES:
        raise SaliencyInputError(f"frames must be 'all' (remove from every stacked frame) or 'newest', got {frames!r}")
    margin = check_positive_int("margin", margin, 0)
    ring_width = check_positive_int("ring_width", ring_width, 1)
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
        acts = jnp.asarray(T.check_actions(actions, n, num_actions(output_shape(apply_fn, params, x.shape,
                                                                                layout=layout))))
    dtype = np.dtype(obs.dtype if hasattr(obs, "dtype") else np.asarray(obs).dtype)
    fn = cached_jit(_build, apply_fn, target, layout, fill_mode, num_classes, h, w, dtype in (np.uint8, np.bool_),
                    frames, int(margin), int(ring_width))
    eff, flips, score, a, present, overlap, residue, share = map_batched(
        fn, params, x, *sources, acts, batch_size=batch_size, rows_per_state=c + 1)
    return ObjectEffects(effect=eff, flips=flips, score=score, actions=a, present=present, overlap=overlap,
                         residue=residue, residue_share=share, classes=names, frames=frames,
                         fill=fill_mode)


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

    Two rank correlations with percentile-bootstrap intervals. within_state: per state, the
    Spearman correlation across classes of share and effect (NaN for a state with fewer than two
    classes or constant shares or effects: left out), averaged over states; 1 = the map ranks
    every state's objects as removing them does. across_states: per class, the Spearman
    correlation across states of its share and its effect (NaN when either is constant, e.g. a
    class the agent ignores). A (state, class) pair where the class is absent (either result's
    `present` is False), was not removed at all (`overlap` 1) or a value is NaN is left out.

    Args:
        shares (ObjectShares | numpy.ndarray): `object_attribution`'s result, or (N, C) numbers.
        effects (ObjectEffects | numpy.ndarray): `object_effects`' result for the same states and
            classes, or (N, C) numbers.
        groups (numpy.ndarray | None): (N,) unit id per state (e.g. episode ids); the bootstrap
            resamples whole units with replacement. Consecutive states of one episode are
            dependent, so pass episodes (or blocks, `jaxsal.metrics.statistics.blocks`). None
            makes each state its own unit: right only for independent states.
        n_resamples (int): bootstrap resamples.
        seed (int): seed of the resampling.
        level (float): the intervals' coverage, in (0, 1).
        share (str): which share of an ObjectShares is correlated: "positive" (default) or
            "absolute".

    Returns:
        dict: `{"within_state": {"mean", "low", "high", "states"}, "across_states": {class:
            {"rho", "low", "high", "states"}}, "units": int, "level": float, "share": str}`;
            "states" counts the states that entered, low/high are the interval's bounds.

    Raises:
        jaxsal.SaliencyInputError: a bad `share`; shares and effects of other classes or shapes
            (not both (N, C)); `groups` not of shape (N,); `n_resamples` not a positive integer;
            `level` outside (0, 1).
    """
    from jaxsal.metrics.object_shares import ObjectShares

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
        if effects.overlap is not None:       # every pixel kept under other boxes: nothing was removed
            p = p & ~(np.asarray(effects.overlap, np.float64) >= 1.0)
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
    n_resamples = check_positive_int("n_resamples", n_resamples)
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
