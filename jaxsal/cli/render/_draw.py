"""Drawing helpers the pictures of a job and of a sweep share: frames as grey images, upscaling,
resizing maps, text that fits, labels, saving a PNG."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def u8(x) -> np.ndarray:
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


def last_frame(stack) -> np.ndarray:
    """What to draw for one observation (H, W, C), grey in [0, 1]: the newest frame of an
    Atari stack (0-255), or the union of the object planes of a binary MinAtar state."""
    a = np.asarray(stack, np.float64)
    return a.max(-1) if a.max() <= 1 else a[..., -1] / 255.0


def grey_planes(stack) -> np.ndarray:
    """(H, W, C) channels as grey images in [0, 1]."""
    a = np.asarray(stack, np.float64)
    return a if a.max() <= 1 else a / 255.0


MAX_SIDE = 4096  # pixels a side of one drawn frame: --scale 10000 asked numpy for tens of GiB


def check_drawing(scale, frame_shape=None, grid_frames=None, fps=None):
    """The numbers of `jaxsal render` (None: not given), before anything is drawn or written: whole numbers
    >= 1, and a `scale` that draws a frame of `frame_shape` (H, W) at most MAX_SIDE pixels a side."""
    from jaxsal.checks import check_positive_int
    from jaxsal.errors import SaliencyInputError

    for flag, v, what in (("--scale", scale, "pixel upscaling of the pictures, e.g. --scale 3"),
                          ("--grid-frames", grid_frames, "frames in grid.png, e.g. --grid-frames 6"),
                          ("--fps", fps, "frames per second of the videos, e.g. --fps 15")):
        try:
            if v is not None:
                check_positive_int(flag, v)
        except SaliencyInputError as e:
            raise SaliencyInputError(f"{e} ({what})") from None
    if frame_shape is not None:
        h, w = int(frame_shape[0]), int(frame_shape[1])
        side = eff_scale(scale, h) * max(h, w)
        if side > MAX_SIDE:
            most = max(1, MAX_SIDE // max(h, w))
            raise SaliencyInputError(f"--scale {scale} draws each {h}x{w} frame {side} pixels a side, more than the "
                                     f"{MAX_SIDE} a picture may take: use --scale {most} or less")


def eff_scale(scale: int, h: int) -> int:
    """Upscaling so that small (e.g. 10x10 MinAtar) frames are still visible (>= ~160 px)."""
    return max(scale, -(-160 // h))


def flat_map(m) -> np.ndarray:
    """(H, W) map; per-frame maps (H, W, C) are summed over the stack."""
    m = np.asarray(m, np.float64)
    return m.sum(-1) if m.ndim == 3 else m


def resize(m, shape) -> np.ndarray:
    if m.shape[:2] == tuple(shape):
        return m
    from skimage.transform import resize as sk_resize

    return sk_resize(m, tuple(shape) + m.shape[2:], order=1, mode="edge", anti_aliasing=False)


def up(img: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(img, scale, 0), scale, 1)


def text_width(text: str) -> float:
    """Pixels `text` takes in the default font (what every label and legend is drawn with)."""
    return ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(text)


def fit(text: str, width: float) -> str:
    """`text`, cut to `width` pixels with "..." when it is longer."""
    if text_width(text) <= width:
        return text
    k = len(text)
    while k > 1 and text_width(text[:k] + "...") > width:
        k -= 1
    return text[:k] + "..."


def wrap(text: str, width: float) -> list[str]:
    """`text` in lines of at most `width` pixels, broken between words (a word wider than a line is split)."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        trial = f"{line} {word}" if line else word
        if text_width(trial) <= width:
            line = trial
            continue
        if line:
            lines.append(line)
        while text_width(word) > width and len(word) > 1:
            k = len(word)
            while k > 1 and text_width(word[:k]) > width:
                k -= 1
            lines.append(word[:k])
            word = word[k:]
        line = word
    lines.append(line)
    return lines


def label(img: np.ndarray, text: str, height: int = 14) -> np.ndarray:
    """The image with a black strip above it holding `text` (cut with "..." if wider than the image)."""
    strip = Image.new("RGB", (img.shape[1], height), (0, 0, 0))
    ImageDraw.Draw(strip).text((2, 1), fit(text, img.shape[1] - 4), fill=(255, 255, 255))
    return np.concatenate([np.asarray(strip), img], 0)


def grey_rgb(frame) -> np.ndarray:
    return u8(np.repeat(np.asarray(frame)[..., None], 3, -1))


def text_rows(text: str, width: int, height: int = 12, fill=(60, 60, 60)) -> np.ndarray:
    """`text` wrapped to `width` pixels, dark on white, one row of `height` pixels per line."""
    lines = wrap(text, width - 4)
    img = Image.fromarray(np.full((height * len(lines), width, 3), 255, np.uint8))
    d = ImageDraw.Draw(img)
    for r, line in enumerate(lines):
        d.text((2, r * height), line, fill=fill)
    return np.asarray(img)


def save_png(path, img) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(path, format="PNG")
    return path
