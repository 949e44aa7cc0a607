"""Object boxes drawn over a frame (numpy RGB, no plotting library): to check tables by eye
and to overlay boxes on saliency maps."""
from __future__ import annotations

import numpy as np

# one colour per class index (tab10-like), cycled
PALETTE = np.array([[255, 60, 60], [60, 200, 255], [255, 200, 0], [120, 255, 80], [255, 80, 255],
                    [255, 140, 40], [160, 120, 255], [0, 255, 200], [255, 255, 255], [120, 120, 120]], np.uint8)


def draw_boxes(image, boxes, labels, scale: int = 4) -> np.ndarray:
    """(H, W) grey or (H, W, 3) uint8 image + one frame's boxes (K, 4) (y0, x0, y1, x1) and
    labels (K,) -> (H*scale, W*scale, 3) uint8 with each box's outline in its class colour."""
    img = np.asarray(image)
    img = np.repeat(img[..., None], 3, -1) if img.ndim == 2 else img[..., :3]
    out = np.repeat(np.repeat(img.astype(np.uint8), scale, 0), scale, 1).copy()
    for (y0, x0, y1, x1), lab in zip(np.asarray(boxes), np.asarray(labels)):
        if lab < 0 or y1 <= y0 or x1 <= x0:
            continue
        c = PALETTE[int(lab) % len(PALETTE)]
        ya, yb, xa, xb = y0 * scale, y1 * scale - 1, x0 * scale, x1 * scale - 1
        out[ya, xa:xb + 1] = c
        out[yb, xa:xb + 1] = c
        out[ya:yb + 1, xa] = c
        out[ya:yb + 1, xb] = c
    return out
