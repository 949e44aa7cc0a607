"""cv2.resize(..., INTER_AREA) for downscaling grey frames, without OpenCV: EnvPool's resize.

OpenCV's area resize for a non-integer scale weights each source pixel by its overlap with
the output pixel's window and accumulates in float32 (horizontal pass, then vertical pass,
in source order), then rounds half to even. We repeat the same weights and float32 order,
so frames agree with EnvPool's bit for bit (tests/game_objects/test_tables.py).
"""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)  # a few (source, target) sizes per game
def _table(src: int, dst: int):
    """Per output pixel: the source indices and float32 weights (padded with weight 0)."""
    scale = src / dst
    idx, wts = [], []
    for d in range(dst):
        f1 = d * scale
        f2 = f1 + scale
        s1, s2 = int(np.ceil(f1)), int(np.floor(f2))
        cell = min(scale, src - f1)
        i, w = [], []
        if s1 - f1 > 1e-3:
            i.append(s1 - 1)
            w.append((s1 - f1) / cell)
        for s in range(s1, s2):
            i.append(s)
            w.append(1.0 / cell)
        if f2 - s2 > 1e-3 and s2 < src:
            i.append(s2)
            w.append(min(min(f2 - s2, 1.0), cell) / cell)
        idx.append(i)
        wts.append(w)
    k = max(map(len, idx))
    out_i, out_w = np.zeros((dst, k), np.int64), np.zeros((dst, k), np.float32)
    for d in range(dst):
        out_i[d, :len(idx[d])] = idx[d]
        out_w[d, :len(wts[d])] = wts[d]
    return out_i, out_w


def resize_area(img: np.ndarray, height: int = 84, width: int = 84) -> np.ndarray:
    """(H, W) uint8 grey frame -> (height, width) uint8, as cv2 INTER_AREA (downscale only)."""
    img = np.asarray(img)
    if img.ndim != 2 or img.shape[0] < height or img.shape[1] < width:
        raise ValueError(f"resize_area downsizes a 2-D grey frame to {height}x{width}, got shape {img.shape}")
    iy, wy = _table(img.shape[0], height)
    ix, wx = _table(img.shape[1], width)
    src = img.astype(np.float32)
    rows = np.zeros((img.shape[0], width), np.float32)
    for j in range(ix.shape[1]):
        rows = rows + src[:, ix[:, j]] * wx[:, j]
    out = rows[iy[:, 0]] * wy[:, 0][:, None]
    for j in range(1, iy.shape[1]):
        out = out + rows[iy[:, j]] * wy[:, j][:, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
