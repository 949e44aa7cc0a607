"""Colour scales of saliency maps, fixed over everything rendered together (a whole video, a whole grid):
- "signed" (Paper A): maps standardised over the rollout, (m - mean) / std * gain
  (gain 0.1), clipped to [-1, 1]; positive green, negative red, alpha 0.5.
- "heat": non-negative maps divided by their 99.5th percentile over the rollout, clipped
  to [0, 1], shown with a colour map (for Grad-CAM, occlusion, RISE, ...).
- "auto": signed when the maps have negative values, heat otherwise.
- "abs" (Greydanus 2018 / Paper A's reading of gradient maps): |m| smoothed with a Gaussian
  (sigma 2 px at 84x84), then on the heat scale: readable blobs instead of signed speckle.
- "heat" on signed maps drops the negative values; the scale says how much of |m| it drops.
- Greydanus 2018: actor saliency added to the blue channel, critic saliency to the red one.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from jaxsal.cli.render._draw import text_rows, text_width, u8
from jaxsal.errors import SaliencyInputError


SCHEMES = ("auto", "signed", "heat", "abs")
ABS_SIGMA = 2.0  # px at 84x84: the Gaussian of the "abs" display (scaled with the map size)


def smooth_abs(m, sigma: float = ABS_SIGMA) -> np.ndarray:
    """|m| smoothed by a Gaussian over the spatial axes (H, W), per map; m (..., H, W)."""
    from scipy.ndimage import gaussian_filter

    m = np.abs(np.asarray(m, np.float64))
    s = sigma * m.shape[-1] / 84.0
    return gaussian_filter(m, sigma=[0] * (m.ndim - 2) + [s, s])


class Scale:
    """A colour scale fixed once over a set of maps, then applied to any frame of it."""

    def __init__(self, maps, scheme: str = "auto", gain: float = 0.1, percentile: float = 99.5,
                 alpha: float = 0.5, cmap: str = "inferno"):
        if scheme not in SCHEMES:
            raise SaliencyInputError(f"colour scheme must be one of {SCHEMES}, got {scheme!r}")
        m = np.asarray(maps, np.float64)
        if not np.isfinite(m).all():
            raise SaliencyInputError("maps contain NaN or inf; cannot choose a colour scale")
        if scheme == "auto":
            scheme = "signed" if (m < 0).any() else "heat"
        self.dropped = 0.0
        if scheme == "abs":
            m = smooth_abs(m)
        elif scheme == "heat" and (m < 0).any():
            self.dropped = float(np.abs(np.minimum(m, 0)).sum() / (np.abs(m).sum() or 1.0))
        self.scheme, self.alpha, self.gain = scheme, alpha, gain
        if scheme == "signed":
            self.mean, self.std = float(m.mean()), float(m.std()) or 1.0
        else:
            self.top = float(np.percentile(np.abs(m), percentile)) or float(np.abs(m).max()) or 1.0
        import matplotlib

        self._cmap = matplotlib.colormaps[cmap]

    def values(self, m) -> np.ndarray:
        """Map values on this scale: [-1, 1] (signed) or [0, 1] (heat)."""
        m = np.asarray(m, np.float64)
        if self.scheme == "abs":
            m = smooth_abs(m)
        if self.scheme == "signed":
            return np.clip((m - self.mean) / self.std * self.gain, -1.0, 1.0)
        return np.clip(m / self.top, 0.0, 1.0)

    def overlay(self, frame, m) -> np.ndarray:
        """RGB uint8 (H, W, 3): the grey frame (H, W) in [0, 1] with map m on top."""
        v = self.values(m)
        grey = np.repeat(np.asarray(frame, np.float64)[..., None], 3, -1)
        if self.scheme == "signed":
            colour = np.where(v[..., None] >= 0, [0.0, 1.0, 0.0], [1.0, 0.0, 0.0])
            a = self.alpha * np.abs(v)[..., None]
        else:
            colour = self._cmap(v)[..., :3]
            a = self.alpha * v[..., None]
        return u8((1 - a) * grey + a * colour)

    def describe(self) -> str:
        if self.scheme == "signed":
            return (f"signed: (m - {self.mean:.3g}) / {self.std:.3g} x {self.gain}, clipped to [-1, 1]; "
                    "green positive, red negative")
        if self.scheme == "abs":
            return (f"abs: |m| Gaussian-smoothed (sigma {ABS_SIGMA:g} px at 84x84) / {self.top:.3g} (99.5th "
                    "percentile), clipped to [0, 1]")
        drop = (f"; negative values not shown ({100 * self.dropped:.0f}% of |m|; use --scheme signed or abs)"
                if self.dropped else "")
        return f"heat: m / {self.top:.3g} (99.5th percentile), clipped to [0, 1]{drop}"

    def bar(self, width: int, height: int = 10) -> np.ndarray:
        """The colour bar of this scale, RGB uint8 (height, width): low to high, left to right."""
        t = np.linspace(-1.0 if self.scheme == "signed" else 0.0, 1.0, width)
        row = self.overlay(np.full((1, width), 0.5), t[None, :]) if self.scheme == "signed" else \
            u8(self._cmap(t)[None, :, :3])
        return np.repeat(row, height, 0)

    def ends(self) -> tuple[str, str]:
        """The map values at the two ends of the bar."""
        if self.scheme == "signed":
            half = self.std / self.gain
            return f"{self.mean - half:.2g}", f"{self.mean + half:.2g}"
        return "0", f"{self.top:.2g}"


def greydanus_overlay(frame, actor, critic, actor_scale: Scale, critic_scale: Scale) -> np.ndarray:
    """Greydanus 2018 colouring: actor saliency in the blue channel, critic in the red."""
    rgb = np.repeat(np.asarray(frame, np.float64)[..., None], 3, -1)
    rgb[..., 2] += np.abs(actor_scale.values(actor))
    rgb[..., 0] += np.abs(critic_scale.values(critic))
    return u8(rgb)


def legend(scales: dict, width: int) -> np.ndarray:
    """One strip per method: name, colour bar with its end values, and the scale in words; laid out
    for `width` (name and bar on separate lines, the description wrapped, when the figure is narrow)."""
    strips = []
    for k, sc in scales.items():
        lo, hi = sc.ends()
        ends = f"{lo} .. {hi}"
        bar_w = min(200, max(60, width // 4))
        name_w, ends_w = text_width(k), text_width(ends)
        if 2 + name_w + 6 + bar_w + 6 + ends_w + 2 > width:  # too narrow for one line: the name above the bar
            strips.append(text_rows(k, width, fill=(0, 0, 0), height=14))
            name_w = -6.0
            bar_w = int(max(20, min(bar_w, width - ends_w - 16)))
        x0 = int(round(2 + name_w + 6))
        bar = np.full((14, width, 3), 255, np.uint8)
        bar[2:12, x0:x0 + bar_w] = sc.bar(bar_w)[:, : max(0, min(bar_w, width - x0))]
        img = Image.fromarray(bar)
        d = ImageDraw.Draw(img)
        if name_w >= 0:
            d.text((2, 1), k, fill=(0, 0, 0))
        d.text((x0 + bar_w + 6, 1), ends, fill=(0, 0, 0))
        strips.append(np.asarray(img))
        strips.append(text_rows(sc.describe(), width))
    return np.concatenate(strips, 0) if strips else np.zeros((0, width, 3), np.uint8)
