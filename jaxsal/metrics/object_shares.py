"""Object-level attribution: how much of a saliency map falls on each game object class.

    ob = ...                                            # jaxsal.game_objects.ObjectBoxes (per state, per stacked frame)
    res = jaxsal.metrics.object_attribution(maps, ob)   # maps (N, 84, 84) or per-frame (N, 84, 84, 4)
    res.positive[:, res.classes.index("ball")]          # share of positive mass on the ball, per state
    res.chance                                          # the ball's area share: what a map blind to objects gets

For a class c of a state: `positive` = sum of the map's positive values on c's pixels / sum of
all positive values; `absolute` = the same for |map|; `chance` = c's share of the pixels (the
expected share of a map that ignores objects). A pixel in two classes counts for both. A state
whose map has no positive (absolute) mass gets NaN there. Per-frame maps (N, H, W, F) are
scored against each stacked frame's own masks: `per_frame_positive` (N, F, C) is frame f's mass
on class c in frame f over the map's total mass, and the class shares sum it over frames. Maps
summed over the stack (N, H, W) are scored against the union of the frames' masks
(`frame="union"`, default) or one frame's (`frame=-1`: the newest).
`object_pointing`: is the map's maximum on an object, and which class.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import sizing
from jaxsal.errors import SaliencyInputError


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["positive", "absolute", "chance", "present", "per_frame_positive",
                                "per_frame_absolute", "per_frame_chance"],
                   meta_fields=["classes"])
@dataclasses.dataclass
class ObjectShares:
    """What `object_attribution` gives: per state and class, the share of a map on the class.

    Attributes:
        positive (jax.Array): (N, C) the map's positive mass on the class over its total
            positive mass (NaN for a map with no positive mass).
        absolute (jax.Array): (N, C) the same for |map|.
        chance (jax.Array): (N, C) the class's share of the pixels: what a map blind to objects
            gets.
        present (jax.Array): (N, C) bool, the class has pixels in the state.
        per_frame_positive (jax.Array): (N, F, C) frame f's positive mass on the class in frame
            f over the map's total (F = 1 for maps summed over the stack); sums over F to
            `positive`.
        per_frame_absolute (jax.Array): (N, F, C) the same for |map|.
        per_frame_chance (jax.Array): (N, F, C) the class's pixel share in frame f divided by F;
            sums over F to `chance`.
        classes (tuple[str, ...]): the C class names, in column order.
    """
    positive: jax.Array
    absolute: jax.Array
    chance: jax.Array
    present: jax.Array
    per_frame_positive: jax.Array
    per_frame_absolute: jax.Array
    per_frame_chance: jax.Array
    classes: tuple = ()

    def mean(self) -> dict:
        """Each class's shares averaged over the states where the class is present and the map
        has mass (NaN-aware).

        Returns:
            dict: `{class: {"positive": float, "absolute": float, "chance": float, "states":
                int}}`, "states" counting the states where the class is present.
        """
        out = {}
        for i, c in enumerate(self.classes):
            here = np.asarray(self.present)[:, i]
            row = {}
            for k in ("positive", "absolute", "chance"):
                v = np.asarray(getattr(self, k), np.float64)[here, i]
                row[k] = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
            row["states"] = int(here.sum())
            out[c] = row
        return out


@jax.jit
def _shares(maps, masks):
    """maps (N, F, H, W), masks (N, F, C, H, W) -> per-frame shares (N, F, C) and presence."""
    m = jnp.asarray(maps, jnp.float32)
    mk = jnp.asarray(masks).astype(jnp.float32)
    pos, ab = jnp.maximum(m, 0.0), jnp.abs(m)
    tot_pos = pos.sum((1, 2, 3))[:, None, None]
    tot_abs = ab.sum((1, 2, 3))[:, None, None]
    nan = jnp.float32(jnp.nan)
    pf_pos = jnp.where(tot_pos > 0, jnp.einsum("nfhw,nfchw->nfc", pos, mk) / jnp.where(tot_pos > 0, tot_pos, 1), nan)
    pf_abs = jnp.where(tot_abs > 0, jnp.einsum("nfhw,nfchw->nfc", ab, mk) / jnp.where(tot_abs > 0, tot_abs, 1), nan)
    pf_chance = mk.mean((-2, -1)) / m.shape[1]
    return pf_pos, pf_abs, pf_chance, (mk.sum((-2, -1)) > 0).any(1)


def _check_maps_masks(maps, masks, frame):
    """Maps of 3 or 4 dimensions, masks (or boxes) of the maps' pixel size, `frame` "union" or an
    index, and "union" for per-frame maps (scored against each frame's own masks, so an index
    would be ignored)."""
    from jaxsal.game_objects.boxes import ObjectBoxes

    if maps.ndim not in (3, 4):
        raise SaliencyInputError(f"maps must be (N, H, W) or per-frame (N, H, W, F), got shape {maps.shape}")
    if isinstance(frame, bool) or (frame != "union" and not isinstance(frame, (int, np.integer))):
        raise SaliencyInputError(f"frame must be 'union' or a stacked-frame index like -1, got {frame!r}")
    if maps.ndim == 4 and frame != "union":
        raise SaliencyInputError(f"frame={frame!r} is for maps (N, H, W); per-frame maps (N, H, W, F) are scored "
                                 "against each stacked frame's own masks: leave frame='union'")
    if isinstance(masks, ObjectBoxes):
        if (masks.height, masks.width) != tuple(maps.shape[1:3]):
            raise SaliencyInputError(f"boxes are for {masks.height}x{masks.width} frames, maps are "
                                     f"{maps.shape[1]}x{maps.shape[2]}")
    elif np.ndim(masks) >= 2 and tuple(np.shape(masks)[-2:]) != tuple(maps.shape[1:3]):
        raise SaliencyInputError(f"masks are {np.shape(masks)[-2:]} pixels, maps {maps.shape[1:3]}")


def _check_frames(m, mk):
    """Per-frame maps (N, F, H, W) against masks (N, F', C, H, W): F == F' (2-D maps have F = 1)."""
    if m.shape[1] != mk.shape[1]:
        raise SaliencyInputError(f"per-frame maps have {m.shape[1]} frames, masks {mk.shape[1]}")


def _as_masks(masks, classes, per_frame: bool, frame, n):
    """Masks (N, F, C, H, W) or (N, C, H, W) or ObjectBoxes -> (bool masks with a frame axis, classes)."""
    from jaxsal.game_objects.boxes import ObjectBoxes   # game_objects does not import metrics: no cycle

    if isinstance(masks, ObjectBoxes):
        classes = classes or masks.classes
        masks = masks.masks()
    masks = jnp.asarray(masks)
    if masks.ndim == 4:
        if per_frame:
            raise SaliencyInputError("per-frame maps (N, H, W, F) need per-frame masks (N, F, C, H, W)")
        masks = masks[:, None]
    elif masks.ndim != 5:
        raise SaliencyInputError(f"masks must be (N, F, C, H, W), (N, C, H, W) or ObjectBoxes, got {masks.shape}")
    elif not per_frame:
        masks = masks.any(1, keepdims=True) if frame == "union" else masks[:, frame][:, None]
    if masks.shape[0] != n:
        raise SaliencyInputError(f"{n} maps but masks for {masks.shape[0]} states")
    c = masks.shape[2]
    classes = tuple(classes) if classes else tuple(f"class_{i}" for i in range(c))
    if len(classes) != c:
        raise SaliencyInputError(f"{len(classes)} class names for {c} mask classes")
    return masks, classes


def object_attribution(maps, masks, classes=None, frame="union", batch_size: int = 256) -> ObjectShares:
    """Share of each map's positive and absolute attribution on each game object class.

    For a class c of a state: `positive` = the map's positive mass on c's pixels over its total
    positive mass, `absolute` the same for |map|, `chance` = c's share of the pixels (what a
    map that ignores objects gets); the module docstring has the details.

    Args:
        maps (jax.Array | numpy.ndarray): maps (N, H, W), or per-frame maps (N, H, W, F) scored
            against each stacked frame's own masks.
        masks (jaxsal.game_objects.ObjectBoxes | jax.Array | numpy.ndarray): the objects: boxes, bool
            masks (N, F, C, H, W) per stacked frame, or (N, C, H, W) for maps (N, H, W).
        classes (Sequence[str] | None): the C class names; None takes them from ObjectBoxes (or
            names them "class_0", ...).
        frame (str | int): for maps (N, H, W) and per-frame masks: "union" (default) scores
            against the union of the frames' masks, an int against one frame's (-1: the newest).
        batch_size (int): states per chunk on device (a chunk's masks are built there).

    Returns:
        ObjectShares: `positive`, `absolute`, `chance` (N, C) float, `present` (N, C) bool,
            `per_frame_positive`, `per_frame_absolute`, `per_frame_chance` (N, F, C) (F = 1 for
            maps (N, H, W)) and `classes`; a state whose map has no positive (absolute) mass gets
            NaN there.

    Raises:
        jaxsal.SaliencyInputError: `maps` not 3-D or 4-D; a bad `frame`; boxes or masks of
            another frame size, state count or frame count than the maps; per-frame maps with
            masks without a frame axis; class names that do not match the masks; a batch_size that
            is not a positive int.
    """
    maps = jnp.asarray(maps) if not isinstance(maps, np.ndarray) else maps
    _check_maps_masks(maps, masks, frame)
    per_frame = maps.ndim == 4
    n = maps.shape[0]
    size = sizing.plan(n, batch_size).states
    parts = []
    for s in range(0, n, size):
        chunk = masks[s:s + size]
        mk, names = _as_masks(chunk, classes, per_frame, frame, min(size, n - s))
        m = jnp.asarray(maps[s:s + size])
        m = jnp.moveaxis(m, -1, 1) if per_frame else m[:, None]
        _check_frames(m, mk)
        parts.append(_shares(m, mk))
    pf_pos, pf_abs, pf_chance, present = (jnp.concatenate(p) for p in zip(*parts))
    return ObjectShares(positive=pf_pos.sum(1), absolute=pf_abs.sum(1), chance=pf_chance.sum(1), present=present,
                        per_frame_positive=pf_pos, per_frame_absolute=pf_abs, per_frame_chance=pf_chance,
                        classes=names)


@jax.jit
def _pointing(maps, masks):
    """maps (N, F, H, W), masks (N, F, C, H, W) -> (N, C) bool: the map's maximum lies on class c."""
    n, f, h, w = maps.shape
    top = jnp.argmax(maps.reshape(n, -1), axis=1)
    fi, rest = jnp.divmod(top, h * w)
    yi, xi = jnp.divmod(rest, w)
    return masks[jnp.arange(n), fi, :, yi, xi]


def object_pointing(maps, masks, classes=None, frame="union", batch_size: int = 256):
    """Object pointing game: is each map's maximum on an object, and of which class?

    Chance level is the union of the objects' area share.

    Args:
        maps (jax.Array | numpy.ndarray): maps (N, H, W), or per-frame maps (N, H, W, F) (the
            maximum is then taken over frames too).
        masks (jaxsal.game_objects.ObjectBoxes | jax.Array | numpy.ndarray): the objects, as
            `object_attribution` takes them.
        classes (Sequence[str] | None): the C class names; None takes them from ObjectBoxes.
        frame (str | int): "union" (default) or a stacked-frame index, as in
            `object_attribution`.
        batch_size (int): states per chunk on device.

    Returns:
        tuple[jax.Array, tuple[str, ...]]: `(hits, classes)`: hits (N, C) bool, True where state
            i's map maximum lies on an object of class c (state i hits "any object" when
            `hits[i].any()`), and the class names.

    Raises:
        jaxsal.SaliencyInputError: `maps` not 3-D or 4-D; a bad `frame`; boxes or masks of
            another frame size, state count or frame count than the maps; a batch_size that is not a
            positive int.
    """
    from jaxsal.game_objects.boxes import ObjectBoxes

    maps = np.asarray(maps) if not isinstance(maps, jax.Array) else maps
    _check_maps_masks(maps, masks, frame)
    per_frame = maps.ndim == 4
    out, names = [], None
    size = sizing.plan(maps.shape[0], batch_size).states
    for s in range(0, maps.shape[0], size):
        chunk = masks[s:s + size] if isinstance(masks, ObjectBoxes) else np.asarray(masks)[s:s + size]
        mk, names = _as_masks(chunk, classes, per_frame, frame, min(size, maps.shape[0] - s))
        m = jnp.asarray(maps[s:s + size], jnp.float32)
        m = jnp.moveaxis(m, -1, 1) if per_frame else m[:, None]
        _check_frames(m, mk)
        out.append(_pointing(m, mk))
    return jnp.concatenate(out), names
