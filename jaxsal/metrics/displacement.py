"""Displacements: what the agent's output and its maps do when an object is moved, not removed.

    eff = jaxsal.metrics.displacement_effects(apply_fn, params, obs, moved_obs)   # Q change, action flips
    fol = jaxsal.metrics.map_follows(maps, moved_maps, boxes, moved_boxes, "ball")
    fol.rate()          # share of states whose map mass moved from the old place to the new one

`obs` and `moved_obs` are pairs of frame stacks of one state, the second with one object displaced
(`jaxsal_agents.interventions.displace` makes them with the emulator, so all stacked frames agree).
A displacement keeps the state a state of the game and asks whether the agent uses the object's
position; a removal (`object_effects`) asks what it does without the object.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import targets as T
from jaxsal.batching import map_batched
from jaxsal.caching import cached_jit
from jaxsal.checks import LAYOUTS, check_obs, num_actions, output_shape, target_actions
from jaxsal.errors import SaliencyInputError


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["effect", "flips", "score", "moved_score", "actions"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class DisplacementEffects:
    """Per pair (N,): `effect` = target(obs)_a - target(moved_obs)_a for the action `a` explained in
    the original stack, `score` and `moved_score` those two outputs, `flips` = the greedy action
    (argmax of the Q-values, or of the logits for policy targets) differs on the moved stack."""
    effect: jax.Array
    flips: jax.Array
    score: jax.Array
    moved_score: jax.Array
    actions: jax.Array


def _build(apply_fn, target_name, layout: str):
    """Chunk function (params, obs, moved, actions) -> (effect, flips, score, moved_score, actions)."""
    target = T.get_target(target_name)

    def fn(params, x, xm, actions):
        b = x.shape[0]
        out = apply_fn(params, jnp.concatenate([x, xm], 0))
        orig = jax.tree.map(lambda o: o[:b], out)
        a = jnp.where(actions >= 0, actions, T.greedy(target, orig))
        scores = target.score(out, jnp.concatenate([a, a])).reshape(2, b)
        greedy = T.greedy(target, out, agent=True).reshape(2, b)
        return scores[0] - scores[1], greedy[0] != greedy[1], scores[0], scores[1], a
    return fn


def displacement_effects(apply_fn, params, obs, moved_obs, target="q_chosen", batch_size: int = 256, *,
                         actions=None, layout: str = "NHWC") -> DisplacementEffects:
    """Output change and action flips between each stack and its displaced twin (module doc).

    The action is fixed on the original stack (the target's argmax, or `actions`), so `effect`
    says how much moving the object changes the output for the action the agent took. One
    forward pass per chunk of `batch_size // 2` pairs; chunking never changes a result.

    Args:
        apply_fn (Callable): `apply_fn(params, obs)`, the agent.
        params (PyTree): its parameters.
        obs (jax.Array | numpy.ndarray): the original stacks (N, H, W, F), or (N, F, H, W) with
            `layout="NCHW"`.
        moved_obs (jax.Array | numpy.ndarray): the same states with the object displaced, the
            same shape; row i of both is one state.
        target (str | Callable): what is compared, as in `jaxsal.explain` (default "q_chosen").
        batch_size (int): model rows per forward pass (two per pair).
        actions (jax.Array | numpy.ndarray | None): (N,) actions to compare; None: the target's
            choice on the original stack ("q_action" needs them).
        layout (str): "NHWC" (default) or "NCHW".

    Returns:
        DisplacementEffects: per pair (N,) `effect`, `flips`, `score`, `moved_score` and the
            `actions` compared.

    Raises:
        jaxsal.SaliencyInputError: a bad `layout`; `obs` and `moved_obs` of different shapes;
            invalid frames; "q_action" without `actions`; actions out of range.
    """
    if layout not in LAYOUTS:
        raise SaliencyInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    x, xm = check_obs(obs, layout), check_obs(moved_obs, layout)
    if x.shape != xm.shape:
        raise SaliencyInputError(f"obs {tuple(x.shape)} and moved_obs {tuple(xm.shape)} must have the same shape: "
                                 "row i of both is one state before and after the displacement")
    n = x.shape[0]
    tgt = T.get_target(target)
    if actions is None:
        target_actions(tgt, None, n, None)  # q_action: the caller's actions are needed
        acts = jnp.full((n,), -1, jnp.int32)
    else:
        acts = jnp.asarray(T.check_actions(actions, n, num_actions(output_shape(apply_fn, params, x.shape,
                                                                                layout=layout))))
    fn = cached_jit(_build, apply_fn, target, layout)
    eff, flips, s0, s1, a = map_batched(fn, params, x, xm, acts, batch_size=batch_size, rows_per_state=2)
    return DisplacementEffects(eff, flips, s0, s1, a)


@dataclasses.dataclass(frozen=True)
class MapFollows:
    """Per pair (N,), shares of the maps' mass (absolute or positive, `share`): `moved_on_new` /
    `moved_on_old` = the moved stack's map on the object's new / old place, `orig_on_new` /
    `orig_on_old` = the original map on them; `chance_new` / `chance_old` = those places' area shares (a map blind to the object);
    `shift` = (moved_on_new - orig_on_new) - (moved_on_old - orig_on_old): mass gained at the new
    place plus mass lost at the old one; `follows` = shift > 0. A place is the object's pixels in
    one stack and not the other (union over stacked frames, or per frame for per-frame maps); NaN
    (follows False, `valid` False) where either place is empty or a map has no mass."""
    moved_on_new: np.ndarray
    moved_on_old: np.ndarray
    orig_on_new: np.ndarray
    orig_on_old: np.ndarray
    chance_new: np.ndarray
    chance_old: np.ndarray
    shift: np.ndarray
    follows: np.ndarray
    valid: np.ndarray
    cls: str = ""
    share: str = "absolute"

    def rate(self) -> float:
        """Share of the valid pairs whose map follows the object.

        Returns:
            float: the follow rate, NaN when no pair is valid.
        """
        return float(self.follows[self.valid].mean()) if self.valid.any() else float("nan")

    def mean(self) -> dict:
        """The fields averaged over the valid pairs.

        Returns:
            dict[str, float]: each share field's mean, "rate" and the number of valid "pairs".
        """
        keys = ("moved_on_new", "moved_on_old", "orig_on_new", "orig_on_old", "chance_new", "chance_old", "shift")
        v = self.valid
        out = {k: float(np.mean(getattr(self, k)[v])) if v.any() else float("nan") for k in keys}
        return {**out, "rate": self.rate(), "pairs": int(v.sum())}


def _class_masks(boxes, cls: str, n: int, h: int, w: int):
    """ObjectBoxes -> (N, F, H, W) bool masks of class `cls`."""
    from jaxsal.game_objects.boxes import ObjectBoxes

    if not isinstance(boxes, ObjectBoxes):
        raise SaliencyInputError(f"boxes must be jaxsal.game_objects.ObjectBoxes, got {type(boxes).__name__}")
    if cls not in boxes.classes:
        raise SaliencyInputError(f"no class {cls!r} in the boxes; classes: {list(boxes.classes)}")
    if len(boxes) != n or (boxes.height, boxes.width) != (h, w):
        raise SaliencyInputError(f"boxes are for {len(boxes)} states of {boxes.height}x{boxes.width}, maps are "
                                 f"{n} of {h}x{w}")
    return np.asarray(boxes.masks())[:, :, boxes.classes.index(cls)]


def map_follows(maps, moved_maps, boxes, moved_boxes, cls: str, share: str = "absolute") -> MapFollows:
    """Does the map's mass follow the displaced object (class `cls`) from its old place to its new one?

    A place is the object's pixels in one stack and not the other; a pair follows when the moved
    stack's map gained mass at the new place and lost it at the old one (`MapFollows.shift` > 0).

    Args:
        maps (jax.Array | numpy.ndarray): the original stacks' maps, (N, H, W) summed over the
            stack (scored on the union of the stacked frames' boxes) or (N, H, W, F) per frame
            (each frame on its own boxes).
        moved_maps (jax.Array | numpy.ndarray): the displaced stacks' maps, the same shape.
        boxes (jaxsal.game_objects.ObjectBoxes): the original stacks' boxes.
        moved_boxes (jaxsal.game_objects.ObjectBoxes): the displaced stacks' boxes.
        cls (str): the class that was moved, e.g. "ball".
        share (str): "absolute" (default: |map|, defined for signed maps such as the plain
            gradient) or "positive" (the map's positive part, as `object_attribution`'s).

    Returns:
        MapFollows: per pair (N,) shares on the new and old places of both maps, their chance
            levels, `shift`, `follows` and `valid`; `rate()` and `mean()` summarise them.

    Raises:
        jaxsal.SaliencyInputError: a bad `share`; maps of different shapes or not 3-D/4-D; boxes
            that are not ObjectBoxes, lack `cls` or do not fit the maps.
    """
    if share not in ("absolute", "positive"):
        raise SaliencyInputError(f"share must be 'absolute' or 'positive', got {share!r}")
    m0, m1 = np.asarray(maps, np.float64), np.asarray(moved_maps, np.float64)
    if m0.shape != m1.shape or m0.ndim not in (3, 4):
        raise SaliencyInputError(f"maps and moved_maps must both be (N, H, W) or (N, H, W, F), got {m0.shape} "
                                 f"and {m1.shape}")
    n, h, w = m0.shape[:3]
    old, new = _class_masks(boxes, cls, n, h, w), _class_masks(moved_boxes, cls, n, h, w)   # (N, F, H, W)
    if m0.ndim == 3:
        old, new = old.any(1), new.any(1)
    else:
        if m0.shape[3] != old.shape[1]:
            raise SaliencyInputError(f"per-frame maps have {m0.shape[3]} frames, the boxes {old.shape[1]}")
        m0, m1 = np.moveaxis(m0, -1, 1), np.moveaxis(m1, -1, 1)                          # (N, F, H, W)
    old_only, new_only = old & ~new, new & ~old
    axes = tuple(range(1, old.ndim))

    def part(m, region):
        pos = np.abs(m) if share == "absolute" else np.maximum(m, 0.0)
        tot = pos.sum(axes)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(tot > 0, (pos * region).sum(axes) / tot, np.nan)

    size = float(np.prod(old.shape[1:]))
    mn, mo = part(m1, new_only), part(m1, old_only)
    on, oo = part(m0, new_only), part(m0, old_only)
    shift = (mn - on) - (mo - oo)
    valid = np.isfinite(shift) & new_only.any(axes) & old_only.any(axes)
    shift = np.where(valid, shift, np.nan)
    return MapFollows(mn, mo, on, oo, new_only.sum(axes) / size, old_only.sum(axes) / size, shift,
                      valid & (np.nan_to_num(shift) > 0), valid, cls, share)
