"""Object boxes drawn over a frame (numpy RGB, no plotting library): to check tables by eye
and to overlay boxes on saliency maps (`jaxsal render` on a job with --objects)."""
from __future__ import annotations

import numpy as np

# one colour per class index (tab10-like), cycled
PALETTE = np.array([[255, 60, 60], [60, 200, 255], [255, 200, 0], [120, 255, 80], [255, 80, 255],
                    [255, 140, 40], [160, 120, 255], [0, 255, 200], [255, 255, 255], [120, 120, 120]], np.uint8)


def colour(label: int) -> np.ndarray:
    """RGB uint8 colour of class index `label`."""
    return PALETTE[int(label) % len(PALETTE)]


def outline(image, boxes, labels, scale: int = 1) -> np.ndarray:
    """A copy of an RGB uint8 image that shows a frame upscaled `scale` times, with each box
    (K, 4) (y0, x0, y1, x1) in frame pixels drawn as a 1-px outline in its class colour
    (labels (K,), -1 = no box). The outline runs along the box's outermost upscaled pixels."""
    out = np.array(image, np.uint8, copy=True)
    h, w = out.shape[:2]
    for (y0, x0, y1, x1), lab in zip(np.asarray(boxes), np.asarray(labels)):
        if lab < 0 or y1 <= y0 or x1 <= x0:
            continue
        c = colour(lab)
        ya, yb = int(y0) * scale, min(int(y1) * scale, h) - 1
        xa, xb = int(x0) * scale, min(int(x1) * scale, w) - 1
        out[ya, xa:xb + 1] = c
        out[yb, xa:xb + 1] = c
        out[ya:yb + 1, xa] = c
        out[ya:yb + 1, xb] = c
    return out


def draw_boxes(image, boxes, labels, scale: int = 4) -> np.ndarray:
    """(H, W) grey or (H, W, 3) uint8 image + one frame's boxes (K, 4) (y0, x0, y1, x1) and
    labels (K,) -> (H*scale, W*scale, 3) uint8 with each box's outline in its class colour."""
    img = np.asarray(image)
    img = np.repeat(img[..., None], 3, -1) if img.ndim == 2 else img[..., :3]
    up = np.repeat(np.repeat(img.astype(np.uint8), scale, 0), scale, 1)
    return outline(up, boxes, labels, scale)


def class_legend(classes, width: int, height: int = 14) -> np.ndarray:
    """A white strip (height, width, 3) uint8: a colour swatch and the name of each class."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(np.full((height, width, 3), 255, np.uint8))
    d = ImageDraw.Draw(img)
    d.text((2, 1), "boxes:", fill=(0, 0, 0))
    x = 44
    for i, name in enumerate(classes):
        if x + 12 > width:
            break
        d.rectangle([x, 2, x + 9, height - 3], fill=tuple(int(v) for v in colour(i)), outline=(0, 0, 0))
        d.text((x + 13, 1), str(name), fill=(0, 0, 0))
        x += 13 + 6 * len(str(name)) + 10
    return np.asarray(img)
