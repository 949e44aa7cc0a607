"""Object boxes aligned with the agent's frames: a compact padded layout for whole buffers,
and the boxes -> per-class masks conversion (pure JAX).

`ObjectBoxes` holds, per state and stacked frame, up to K boxes with a class label:
`boxes (N, F, K, 4) int16` as half-open `(y0, x0, y1, x1)` pixel rows/columns of the
observation (84x84), `labels (N, F, K) int8` (-1 = padding), `classes` (names). That is
~500 bytes per Atari state instead of 4 x C x 84 x 84 mask bits; `masks()` expands them on
device when needed.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.game_objects.table import SCREEN_H, SCREEN_W


def screen_to_obs(box, obs_h: int = 84, obs_w: int = 84, screen_h: int = SCREEN_H, screen_w: int = SCREEN_W):
    """Raw-screen box (x, y, w, h) -> half-open (y0, x0, y1, x1) in the resized observation:
    every observation pixel whose area-averaging window (cv2 INTER_AREA) overlaps the box."""
    x, y, w, h = box
    sy, sx = screen_h / obs_h, screen_w / obs_w
    y0, x0 = math.floor(y / sy + 1e-9), math.floor(x / sx + 1e-9)
    y1, x1 = math.ceil((y + h) / sy - 1e-9), math.ceil((x + w) / sx - 1e-9)
    return (max(y0, 0), max(x0, 0), min(y1, obs_h), min(x1, obs_w))


@dataclasses.dataclass
class ObjectBoxes:
    """Per-state, per-stacked-frame object boxes (see module doc); `len()` is the number of states."""
    boxes: np.ndarray      # (N, F, K, 4) int16, (y0, x0, y1, x1) half-open
    labels: np.ndarray     # (N, F, K) int8, class index or -1
    classes: tuple
    height: int = 84
    width: int = 84

    def __post_init__(self):
        self.boxes = np.asarray(self.boxes, np.int16)
        self.labels = np.asarray(self.labels, np.int8)
        self.classes = tuple(self.classes)
        if self.boxes.ndim != 4 or self.boxes.shape[-1] != 4 or self.labels.shape != self.boxes.shape[:3]:
            raise ValueError(f"ObjectBoxes: boxes must be (N, F, K, 4) and labels (N, F, K), got "
                             f"{self.boxes.shape} and {self.labels.shape}")
        if self.labels.size and self.labels.max() >= len(self.classes):
            raise ValueError(f"ObjectBoxes: label {int(self.labels.max())} but only {len(self.classes)} classes")

    def __len__(self):
        return self.boxes.shape[0]

    def __getitem__(self, idx):
        """A subset of states (slice, index array or bool mask), same classes."""
        idx = slice(idx, idx + 1) if isinstance(idx, (int, np.integer)) else idx
        return dataclasses.replace(self, boxes=self.boxes[idx], labels=self.labels[idx])

    def masks(self, frame=None):
        """Boolean masks on device: (N, F, C, H, W), or (N, C, H, W) for one stacked frame
        (`frame=-1`: the newest) or their union over the stack (`frame="union"`)."""
        m = boxes_to_masks(self.boxes, self.labels, len(self.classes), self.height, self.width)
        if frame is None:
            return m
        if frame == "union":
            return m.any(axis=1)
        return m[:, frame]

    def save(self, path, game: str | None = None):
        """One .npz (boxes, labels, class names, frame size, optionally the game; no pickle): the
        objects file `jaxsal explain --objects FILE` reads (format: `jaxsal.io.object_files`)."""
        extra = {"game": np.asarray(game)} if game else {}
        np.savez_compressed(path, boxes=self.boxes, labels=self.labels, classes=np.asarray(self.classes),
                            size=np.asarray([self.height, self.width]), **extra)

    @classmethod
    def load(cls, path):
        with np.load(path, allow_pickle=False) as z:
            h, w = (int(v) for v in z["size"])
            return cls(z["boxes"], z["labels"], tuple(str(c) for c in z["classes"]), h, w)

    @classmethod
    def concatenate(cls, parts):
        """Stack several ObjectBoxes of the same classes along states (K padded to the widest)."""
        parts = list(parts)
        if not parts:
            raise ValueError("ObjectBoxes.concatenate needs at least one part")
        if len({p.classes for p in parts}) != 1:
            raise ValueError("ObjectBoxes.concatenate: parts have different classes")
        k = max(p.boxes.shape[2] for p in parts)
        pad = [(np.pad(p.boxes, ((0, 0), (0, 0), (0, k - p.boxes.shape[2]), (0, 0))),
                np.pad(p.labels, ((0, 0), (0, 0), (0, k - p.labels.shape[2])), constant_values=-1))
               for p in parts]
        return cls(np.concatenate([b for b, _ in pad]), np.concatenate([lab for _, lab in pad]),
                   parts[0].classes, parts[0].height, parts[0].width)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def boxes_to_masks(boxes, labels, num_classes: int, height: int = 84, width: int = 84):
    """(..., K, 4) half-open boxes + (..., K) labels -> (..., C, H, W) bool: pixel in any box of
    class c. One matmul per (state, frame): rows-in-box (C*H, K) @ cols-in-box (K, W)."""
    boxes = jnp.asarray(boxes, jnp.int32)
    ys, xs = jnp.arange(height), jnp.arange(width)
    rows = (ys >= boxes[..., 0:1]) & (ys < boxes[..., 2:3])              # (..., K, H)
    cols = (xs >= boxes[..., 1:2]) & (xs < boxes[..., 3:4])              # (..., K, W)
    onehot = jnp.asarray(labels)[..., None] == jnp.arange(num_classes)   # (..., K, C)
    rows_c = (onehot[..., :, None] & rows[..., None, :]).astype(jnp.float32)   # (..., K, C, H)
    hits = jnp.einsum("...kch,...kw->...chw", rows_c, cols.astype(jnp.float32))
    return hits > 0
