"""Pictures of saliency maps: overlays, PNG grids, per-stacked-frame views, MP4/GIF videos, HTML.

Colour scales are fixed over everything rendered together (a whole video, a whole grid):
- "signed" (Paper A): maps standardised over the rollout, (m - mean) / std * gain
  (gain 0.1), clipped to [-1, 1]; positive green, negative red, alpha 0.5.
- "heat": non-negative maps divided by their 99.5th percentile over the rollout, clipped
  to [0, 1], shown with a colour map (for Grad-CAM, occlusion, RISE, ...).
- "auto": signed when the maps have negative values, heat otherwise.
- "abs" (Greydanus 2018 / Paper A's reading of gradient maps): |m| smoothed with a Gaussian
  (sigma 2 px at 84x84), then on the heat scale: readable blobs instead of signed speckle.
- "heat" on signed maps drops the negative values; the scale says how much of |m| it drops.
- Greydanus 2018: actor saliency added to the blue channel, critic saliency to the red one.

Jobs run with `--objects` have boxes per stacked frame: grids and videos outline the newest
frame's objects on the frame and on every overlay (class colours, legend below), the
per-stacked-frame view each frame's own objects. Jobs run with `--objects --effects` also get,
for the states of the per-stacked-frame views, effects_XXXXXX.png: the frame, the overlays and
boxes, and a bar per class of how much the explained output drops when the class is removed
(thick outline and "flips": the greedy action changes).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from jaxsal.errors import SaliencyInputError

SCHEMES = ("auto", "signed", "heat", "abs")
ABS_SIGMA = 2.0  # px at 84x84: the Gaussian of the "abs" display (scaled with the map size)


def smooth_abs(m, sigma: float = ABS_SIGMA) -> np.ndarray:
    """|m| smoothed by a Gaussian over the spatial axes (H, W), per map; m (..., H, W)."""
    from scipy.ndimage import gaussian_filter

    m = np.abs(np.asarray(m, np.float64))
    s = sigma * m.shape[-1] / 84.0
    return gaussian_filter(m, sigma=[0] * (m.ndim - 2) + [s, s])


# --------------------------------------------------------------------------- colour scales
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
        return _u8((1 - a) * grey + a * colour)

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
            _u8(self._cmap(t)[None, :, :3])
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
    return _u8(rgb)


def _u8(x) -> np.ndarray:
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


# --------------------------------------------------------------------------- helpers
def last_frame(stack) -> np.ndarray:
    """What to draw for one observation (H, W, C), grey in [0, 1]: the newest frame of an
    Atari stack (0-255), or the union of the object planes of a binary MinAtar state."""
    a = np.asarray(stack, np.float64)
    return a.max(-1) if a.max() <= 1 else a[..., -1] / 255.0


def _planes(stack) -> np.ndarray:
    """(H, W, C) channels as grey images in [0, 1]."""
    a = np.asarray(stack, np.float64)
    return a if a.max() <= 1 else a / 255.0


def _eff_scale(scale: int, h: int) -> int:
    """Upscaling so that small (e.g. 10x10 MinAtar) frames are still visible (>= ~160 px)."""
    return max(scale, -(-160 // h))


def flat_map(m) -> np.ndarray:
    """(H, W) map; per-frame maps (H, W, C) are summed over the stack."""
    m = np.asarray(m, np.float64)
    return m.sum(-1) if m.ndim == 3 else m


def _resize(m, shape) -> np.ndarray:
    if m.shape[:2] == tuple(shape):
        return m
    from skimage.transform import resize

    return resize(m, tuple(shape) + m.shape[2:], order=1, mode="edge", anti_aliasing=False)


def _up(img: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(img, scale, 0), scale, 1)


def _text_width(text: str) -> float:
    """Pixels `text` takes in the default font (what every label and legend is drawn with)."""
    return ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(text)


def _fit(text: str, width: float) -> str:
    """`text`, cut to `width` pixels with "..." when it is longer."""
    if _text_width(text) <= width:
        return text
    k = len(text)
    while k > 1 and _text_width(text[:k] + "...") > width:
        k -= 1
    return text[:k] + "..."


def _wrap(text: str, width: float) -> list[str]:
    """`text` in lines of at most `width` pixels, broken between words (a word wider than a line is split)."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        trial = f"{line} {word}" if line else word
        if _text_width(trial) <= width:
            line = trial
            continue
        if line:
            lines.append(line)
        while _text_width(word) > width and len(word) > 1:
            k = len(word)
            while k > 1 and _text_width(word[:k]) > width:
                k -= 1
            lines.append(word[:k])
            word = word[k:]
        line = word
    lines.append(line)
    return lines


def _label(img: np.ndarray, text: str, height: int = 14) -> np.ndarray:
    """The image with a black strip above it holding `text` (cut with "..." if wider than the image)."""
    strip = Image.new("RGB", (img.shape[1], height), (0, 0, 0))
    ImageDraw.Draw(strip).text((2, 1), _fit(text, img.shape[1] - 4), fill=(255, 255, 255))
    return np.concatenate([np.asarray(strip), img], 0)


def _grey_rgb(frame) -> np.ndarray:
    return _u8(np.repeat(np.asarray(frame)[..., None], 3, -1))


def _check_maps(maps: dict, n: int):
    if not maps:
        raise SaliencyInputError("nothing to render: no maps given")
    for k, m in maps.items():
        if len(m) != n:
            raise SaliencyInputError(f"maps {k!r} have {len(m)} entries but there are {n} frames")


# --------------------------------------------------------------------------- pictures
def _outlined(tile: np.ndarray, scale: int, boxes, i: int, frame: int = -1) -> np.ndarray:
    """An upscaled tile with stacked frame `frame`'s object boxes of state i (ObjectBoxes) outlined."""
    if boxes is None:
        return tile
    from jaxsal.objects.draw import outline

    return outline(tile, boxes.boxes[i, frame], boxes.labels[i, frame], scale)


def composite(frames, maps: dict, scales: dict, i: int, scale: int = 3, labels: bool = True,
              greydanus: tuple | None = None, boxes=None) -> np.ndarray:
    """One row: frame | overlay per method (| Greydanus actor/critic view), RGB uint8; with
    `boxes` (jaxsal.objects.ObjectBoxes aligned with `frames`) the newest frame's objects outlined."""
    f = last_frame(frames[i])
    tiles = [("frame", _grey_rgb(f))]
    for k, m in maps.items():
        tiles.append((k, scales[k].overlay(f, _resize(flat_map(m[i]), f.shape))))
    if greydanus is not None:
        a, c = greydanus
        tiles.append((f"{a}(blue)/{c}(red)", greydanus_overlay(
            f, _resize(flat_map(maps[a][i]), f.shape), _resize(flat_map(maps[c][i]), f.shape),
            scales[a], scales[c])))
    scale = _eff_scale(scale, f.shape[0])
    ups = [(name, _outlined(_up(t, scale), scale, boxes, i)) for name, t in tiles]
    out = [_label(t, name) if labels else t for name, t in ups]
    return np.concatenate(out, 1)


def _box_legend(boxes, width: int) -> np.ndarray:
    if boxes is None:
        return np.zeros((0, width, 3), np.uint8)
    from jaxsal.objects.draw import class_legend

    return class_legend(boxes.classes, width)


def grid_png(path, frames, maps: dict, indices, scheme: str = "auto", scale: int = 3,
             scales: dict | None = None, captions: dict | None = None, boxes=None) -> Path:
    """PNG grid: one row per chosen frame, columns frame | overlay per method; each row says its
    frame (and, given `captions`, the action and its Q-value); a colour bar per method below.
    `boxes` (ObjectBoxes aligned with `frames`): object outlines and a class legend."""
    scales = scales or {k: Scale(np.stack([flat_map(m[i]) for i in indices]), scheme) for k, m in maps.items()}
    rows = []
    for i in indices:
        row = composite(frames, maps, scales, int(i), scale=scale, boxes=boxes)
        rows.append(_label(row, (captions or {}).get(int(i), f"frame {int(i)}")))
    grid = np.concatenate(rows, 0)
    return _save_png(path, np.concatenate([grid, _box_legend(boxes, grid.shape[1]),
                                           legend(scales, grid.shape[1])], 0))


def legend(scales: dict, width: int) -> np.ndarray:
    """One strip per method: name, colour bar with its end values, and the scale in words; laid out
    for `width` (name and bar on separate lines, the description wrapped, when the figure is narrow)."""
    strips = []
    for k, sc in scales.items():
        lo, hi = sc.ends()
        ends = f"{lo} .. {hi}"
        bar_w = min(200, max(60, width // 4))
        name_w, ends_w = _text_width(k), _text_width(ends)
        if 2 + name_w + 6 + bar_w + 6 + ends_w + 2 > width:  # too narrow for one line: the name above the bar
            strips.append(_text_rows(k, width, fill=(0, 0, 0), height=14))
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
        strips.append(_text_rows(sc.describe(), width))
    return np.concatenate(strips, 0) if strips else np.zeros((0, width, 3), np.uint8)


def _text_rows(text: str, width: int, height: int = 12, fill=(60, 60, 60)) -> np.ndarray:
    """`text` wrapped to `width` pixels, dark on white, one row of `height` pixels per line."""
    lines = _wrap(text, width - 4)
    img = Image.fromarray(np.full((height * len(lines), width, 3), 255, np.uint8))
    d = ImageDraw.Draw(img)
    for r, line in enumerate(lines):
        d.text((2, r * height), line, fill=fill)
    return np.asarray(img)


def stack_png(path, frames, maps: dict, i: int, scheme: str = "auto", scale: int = 3,
              scales: dict | None = None, boxes=None) -> Path:
    """Per-stacked-frame view of state i: columns = the stacked frames (oldest to newest), rows = the
    raw frames, then each method's map over every frame: its per-frame maps (frame j's own map on
    frame j) when it has them, else the one map of the stack drawn over each frame; the colour bars
    below. `scales` should be fitted to what is drawn (per-frame maps: to per-frame maps, see
    render_dir); `boxes`: each stacked frame's own objects outlined."""
    stack = _planes(frames[i])
    c = stack.shape[-1]
    scale = _eff_scale(scale, stack.shape[0])
    if boxes is not None and boxes.boxes.shape[1] != c:
        boxes = None  # boxes for another stack depth: nothing to align them with
    rows = [np.concatenate([_label(_outlined(_up(_grey_rgb(stack[..., j]), scale), scale, boxes, i, j),
                                   f"t-{c - 1 - j}") for j in range(c)], 1)]
    width = rows[0].shape[1]
    used = {}
    for k, m in maps.items():
        mi = np.asarray(m[i], np.float64)
        each = mi.ndim == 3 and mi.shape[-1] == c  # the stacked frames' own maps
        sc = used[k] = (scales or {}).get(k) or Scale(np.moveaxis(mi, -1, 0) if each else flat_map(mi), scheme)
        if each:
            planes = [_resize(mi[..., j], stack.shape[:2]) for j in range(c)]
            text = f"{k}: each stacked frame's own map"
        else:
            planes = [_resize(flat_map(mi), stack.shape[:2])] * c
            text = f"{k}: one map for the whole stack, drawn over each frame{_per_frame_hint(k)}"
        tiles = [_outlined(_up(sc.overlay(stack[..., j], planes[j]), scale), scale, boxes, i, j) for j in range(c)]
        rows.append(_label(np.concatenate(tiles, 1), text))
    rows.append(_box_legend(boxes, width))
    rows.append(legend(used, width))
    return _save_png(path, np.concatenate(rows, 0))


def _per_frame_hint(method: str) -> str:
    """The per-frame option, named only for methods that give per-frame maps on any model (the
    input-resolution ones); layer-resolution and perturbation methods refuse it."""
    from jaxsal.backprop import cam, single_backward
    ok = (method in single_backward.INPUT_RULES or method in ("smoothgrad", "integrated_gradients")
          or (method in cam.CAMS and cam.CAMS[method].guided_input))
    return f" (per-frame maps: --option {method}.per_frame=true)" if ok else ""


TARGET_SYMBOL = {"q_chosen": "Q", "q_action": "Q", "advantage": "A", "value": "V", "policy_logit": "logit",
                 "log_prob": "log p", "softmax_chosen": "p"}


FLAG_COLOUR = (170, 90, 0)       # effect_bars' "kept N%" / "residue" marks


def effect_bars(effect, flips, present, classes, height: int, width: int = 240, target: str = "q_chosen",
                action: int | None = None, overlap=None, residue=None) -> np.ndarray:
    """RGB uint8 (height, width): a bar per class of how much the explained output drops when the class
    is removed (`jaxsal.metrics.object_effects`: effect (C,), flips (C,), present (C,) of one state),
    in the class's box colour, on a scale fixed to this state's largest |effect|; a bar whose removal
    flips the greedy action is outlined thick and marked "flips", an absent class says so. Given the
    removal's overlap (C,) and residue (C,): "kept N%" where at least 5% of the class's box pixels lay in
    other boxes (kept, not removed), "residue" where pixels were left around its boxes (in amber)."""
    from jaxsal.objects.draw import colour

    sym = TARGET_SYMBOL.get(str(target), str(target))
    title = f"{sym} drop when removed" + (f" (action {action})" if action is not None and sym in ("Q", "logit") else "")
    img = Image.fromarray(np.full((height, width, 3), 255, np.uint8))
    d = ImageDraw.Draw(img)
    d.text((4, 2), _fit(title, width - 8), fill=(0, 0, 0))
    eff = np.asarray(effect, np.float64)
    here = np.asarray(present, bool) & np.isfinite(eff)
    top = float(np.abs(eff[here]).max()) if here.any() else 0.0
    top = top or 1.0
    name_w = int(min(width // 3, max([_text_width(str(c)) for c in classes] + [20]) + 8))
    value_w = int(_text_width("-0.000e-00 flips")) + 8                 # the values, in a column on the right
    kept = np.zeros(len(classes)) if overlap is None else np.nan_to_num(np.asarray(overlap, np.float64))
    left = np.zeros(len(classes), bool) if residue is None else np.asarray(residue) > 0
    x0, x1 = name_w, width - value_w
    neg = bool((eff[here] < 0).any())
    zero = (x0 + x1) // 2 if neg else x0
    half = (x1 - zero) if not neg else (x1 - x0) // 2
    c = len(classes)
    row_h = int(max(10, min(22, (height - 34) // max(c, 1))))
    y = 20
    d.line([(zero, y - 2), (zero, y + row_h * c)], fill=(0, 0, 0))
    for j, name in enumerate(classes):
        yc = y + j * row_h
        d.text((4, yc + (row_h - 11) // 2), _fit(str(name), name_w - 6), fill=(0, 0, 0))
        if not here[j]:
            d.text((zero + 4, yc + (row_h - 11) // 2), "not on screen", fill=(150, 150, 150))
            continue
        v = float(eff[j])
        end = zero + int(round(v / top * half))
        lo, hi = sorted((zero, end))
        thick = bool(flips[j])
        d.rectangle([lo, yc + 2, max(hi, lo + 1), yc + row_h - 3], fill=tuple(int(k) for k in colour(j)),
                    outline=(0, 0, 0), width=2 if thick else 1)
        text = f"{v:.3g}" + (" flips" if thick else "")
        flag = " ".join(([f"kept {kept[j]:.0%}"] if kept[j] >= 0.05 else []) + (["residue"] if left[j] else []))
        two = row_h >= 21                         # room for the flag under the value
        d.text((x1 + 6, yc + (0 if two and flag else (row_h - 11) // 2)), text + ("" if two or not flag else " *"),
               fill=(200, 0, 0) if thick else (0, 0, 0))
        if flag and two:
            d.text((x1 + 6, yc + 10), _fit(flag, value_w - 8), fill=FLAG_COLOUR)
    foot = min(height - 12, y + row_h * c + 2)
    d.text((4, foot), _fit("thick outline, \"flips\": the greedy action changes", width - 8), fill=(90, 90, 90))
    if (kept >= 0.05).any() or left.any():
        note = "kept: inside other boxes; residue: pixels left" + ("" if row_h >= 21 else " (*)")
        d.text((4, min(height - 12, foot + 12)), _fit(note, width - 8), fill=(90, 90, 90))
    return np.asarray(img)


def effects_png(path, frames, maps: dict, i: int, effects: dict, row: int, scale: int = 3,
                scales: dict | None = None, scheme: str = "auto", boxes=None, caption: str | None = None,
                target: str = "q_chosen") -> Path:
    """One state's causal object effects: frame | map overlay per method (with the object boxes) | a bar
    per class of how much the explained output drops when the class is removed (flipped actions marked);
    `effects` is `jaxsal.load_object_effects`'s dict, `row` state i's row in it; colour bars below."""
    scales = scales or {k: Scale(flat_map(m[i]), scheme) for k, m in maps.items()}
    pic = composite(frames, maps, scales, i, scale=scale, boxes=boxes)
    bars = effect_bars(effects["effect"][row], effects["flips"][row], effects["present"][row], effects["classes"],
                       pic.shape[0], target=target, action=int(effects["action"][row]),
                       overlap=effects["overlap"][row] if "overlap" in effects else None,
                       residue=effects["residue"][row] if "residue" in effects else None)
    pic = _label(np.concatenate([pic, bars], 1), caption or f"frame {i}")
    return _save_png(path, np.concatenate([pic, _box_legend(boxes, pic.shape[1]), legend(scales, pic.shape[1])], 0))


def _save_png(path, img) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(path, format="PNG")
    return path


def video(path, frames, maps: dict, scheme: str = "auto", fps: int = 15, scale: int = 3,
          greydanus: tuple | None = None, scales: dict | None = None, captions: dict | None = None,
          first: int = 0, boxes=None) -> Path:
    """MP4 or GIF (by suffix) of frame | overlays for every frame, colour scale fixed over the video;
    each frame is captioned with its index (and the action and Q-value given `captions`), with the
    colour bars below."""
    path = Path(path)
    n = len(frames)
    _check_maps(maps, n)
    scales = scales or {k: Scale(np.stack([flat_map(x) for x in m]), scheme) for k, m in maps.items()}

    def frame_img(i):
        row = composite(frames, maps, scales, i, scale=scale, greydanus=greydanus, boxes=boxes)
        row = _label(row, (captions or {}).get(i, f"frame {first + i}"))
        return np.concatenate([row, _box_legend(boxes, row.shape[1]), legend(scales, row.shape[1])], 0)
    imgs = (frame_img(i) for i in range(n))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        import imageio.v3 as iio

        iio.imwrite(path, np.stack(list(imgs)), extension=".gif", duration=1000 / fps, loop=0)
    elif path.suffix.lower() == ".mp4":
        import warnings

        import imageio.v2 as iio2

        with warnings.catch_warnings():  # ffmpeg is started with fork+exec, which is safe here
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            with iio2.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                 pixelformat="yuv420p", macro_block_size=1, quality=7) as w:
                for img in imgs:
                    h, wd = img.shape[:2]
                    w.append_data(np.ascontiguousarray(img[: h - h % 2, : wd - wd % 2]))
    else:
        raise SaliencyInputError(f"video {path}: use a .mp4 or .gif file name")
    return path


# --------------------------------------------------------------------------- gallery
def render_dir(out, methods=None, gallery=None, frames=None, start: int = 0, stop: int | None = None,
               grid_frames: int = 6, videos=("mp4", "gif"), scheme: str = "auto", fps: int = 15,
               scale: int = 3, greydanus: tuple | None = None, max_video_frames: int = 1000,
               objects=None, boxes: bool = True) -> dict:
    """Render a `jaxsal explain` output directory: PNG grid, per-frame views, videos, index.html.

    `frames` (N, H, W, C) defaults to the job's input, reopened from the manifest. Only
    frames [start, stop) are read. A job run with --objects gets its object boxes drawn
    (`boxes=False`: not), read from the objects file it used (`objects=PATH` if it moved).
    Returns {"html": path, "pngs": [...], "videos": [...]}.
    """
    from jaxsal.io.layout import as_layout
    from jaxsal.io.store import finished_frames, load_maps, load_outputs, read_manifest

    out = Path(out)
    manifest = read_manifest(out)
    cfg = manifest["config"]
    if cfg.get("store") == "shares":
        raise SaliencyInputError(f"{out} stored only object shares (--store shares), no maps to render; rerun "
                                 "`jaxsal explain` without --store shares into a new --out to see the maps")
    names = list(cfg["methods"]) if methods is None else list(methods)
    for k in names:
        if k not in cfg["methods"]:
            raise SaliencyInputError(f"{out} has no maps for {k!r}; it holds {', '.join(cfg['methods'])}")
    if greydanus is not None:
        for k in greydanus:
            if k not in names:
                raise SaliencyInputError(f"--greydanus names {k!r}, which is not among the rendered "
                                         f"methods {names}")
    n = int(cfg["n"])
    stop = n if stop is None else min(stop, n)
    if not 0 <= start < stop:
        raise SaliencyInputError(f"frame range {start}:{stop} is empty (the job has {n} frames)")
    done = finished_frames(out, names)
    if not done[start:stop].all():  # an incomplete job: its finished frames from `start` on
        if not done[start]:
            have = np.flatnonzero(done)
            raise SaliencyInputError(f"{out}: frame {start} is not computed yet" + (
                f"; finished frames start at {have[0]} (render --frames {have[0]}:)" if len(have) else
                "; no chunk is finished yet"))
        stop = start + int(np.argmin(done[start:stop]))
    if stop - start > max_video_frames:
        stop = start + max_video_frames
    if frames is None:
        frames = as_layout(_job_input(out, manifest), "NHWC").read(start, stop)
    else:
        frames = np.asarray(frames)
        frames = as_layout(_Array(frames), "NHWC").read(start, min(stop, len(frames)))
    maps = {k: load_maps(out, k, allow_incomplete=True)[start:stop] for k in names}
    _check_maps(maps, len(frames))
    ob = _job_boxes(out, manifest, objects) if boxes else None   # None: a job without --objects
    ob = ob[start:start + len(frames)] if ob is not None else None
    if scheme not in SCHEMES:
        raise SaliencyInputError(f"--scheme must be one of {SCHEMES}, got {scheme!r}")
    scales = {k: Scale(np.stack([flat_map(x) for x in m]), scheme) for k, m in maps.items()}
    gallery = Path(gallery) if gallery is not None else out / "gallery"
    gallery.mkdir(parents=True, exist_ok=True)
    idx = np.unique(np.linspace(0, len(frames) - 1, min(grid_frames, len(frames))).round().astype(int))
    captions = _captions(out, start, stop, load_outputs)
    pngs = [grid_png(gallery / "grid.png", frames, maps, idx, scale=scale, scales=scales, captions=captions,
                     boxes=ob)]
    shown = [int(i) for i in idx[:3]]
    stack_scales = {k: (Scale(np.concatenate([np.moveaxis(np.asarray(m[i]), -1, 0) for i in shown]), scales[k].scheme)
                        if np.ndim(m[0]) == 3 and np.shape(m[0])[-1] == np.shape(frames)[-1] else scales[k])
                    for k, m in maps.items()}  # per-frame maps: a scale of per-frame maps, not of their sum
    for i in shown:
        pngs.append(stack_png(gallery / f"stack_{start + i:06d}.png", frames, maps, i, scale=scale,
                              scales=stack_scales, boxes=ob))
    if "effects" in cfg.get("objects", {}):  # --effects: one figure per shown state, its effects beside its maps
        from jaxsal.io.objects import load_object_effects

        eff = load_object_effects(out, allow_incomplete=True)
        where = {int(f): r for r, f in enumerate(eff["frame"])}
        for i in shown:
            if start + i in where:
                pngs.append(effects_png(gallery / f"effects_{start + i:06d}.png", frames, maps, i, eff,
                                        where[start + i], scale=scale, scales=scales, boxes=ob,
                                        caption=captions.get(i), target=cfg.get("target", "q_chosen")))
    vids = []
    for ext in videos:
        vids.append(video(gallery / f"episode.{ext}", frames, maps, fps=fps, scale=2 if ext == "gif" else scale,
                          greydanus=greydanus, scales=scales, captions=captions, first=start, boxes=ob))
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("summary-p*.json"))]
    page = gallery / "index.html"
    page.write_text(_html(manifest, names, scales, pngs, vids, start, stop, summaries))
    return {"html": page, "pngs": pngs, "videos": vids}


def _candidates(out, stored) -> list[Path]:
    """Where a file the manifest names may be: its path (absolute in new jobs); for a relative path (older
    jobs recorded it relative to where `jaxsal explain` ran) that path from here, then from the output
    directory and each directory above it."""
    p = Path(stored)
    if p.is_absolute():
        return [p]
    here = Path(out).absolute()
    return list(dict.fromkeys([p, here / p, *(d / p for d in here.parents)]))


def _job_input(out, manifest):
    """The job's input as a source, found by `_candidates` and checked against the job's input checksum
    (a buffer rewritten or replaced since the job is refused, never drawn under the maps)."""
    from jaxsal.io import open_source

    cfg = manifest["config"]
    stored = (manifest.get("input_source") or {}).get("path")
    want = (cfg.get("input") or {}).get("checksum")
    want = want.split("[:")[0] if want else None  # a --limit job records the file's checksum[:n]
    cands = _candidates(out, stored) if stored else []
    if "play" in (cfg.get("input") or {}):
        cands.append(Path(out).absolute() / "input" / "obs.npy")  # where --play saves its rollout
    changed = None
    for c in cands:
        if c.exists():
            source = open_source(c)
            if want is None or source.fingerprint() == want:
                return source
            changed = changed or c
    if changed is not None:
        raise SaliencyInputError(f"the input of {out} ({changed}) has changed since the job ran (its checksum "
                                 "differs); pass the job's frames with render --input PATH")
    raise SaliencyInputError(f"the input of {out} ({stored}) is not available; pass the frames "
                             "(render --input PATH)")


def _job_boxes(out, manifest, path=None):
    """The ObjectBoxes of a job's frames (all N), or None for a job without --objects and no `path`.
    The job's own objects file, or `path`, which must be the file the job used (same checksum)."""
    from jaxsal.io.objects import check_aligned, read_objects

    cfg = manifest["config"]
    if "objects" not in cfg and path is None:
        return None
    where = path or (manifest.get("objects_source") or {}).get("path")
    if where and not path:  # an older job's relative path: from here, else beside the output directory
        where = next((c for c in _candidates(out, where) if c.exists()), where)
    if not where or not Path(where).exists():
        raise SaliencyInputError(f"the object boxes of {out} ({where}) are not available; pass the objects file "
                                 "(render --objects FILE) or render without boxes (--no-boxes)")
    ob = read_objects(where)
    n = int(cfg["n"])
    if "objects" in cfg:
        want = cfg["objects"]["checksum"].split("[:")[0]  # a --limit job records the file's checksum[:n]
        if ob.checksum != want:
            raise SaliencyInputError(f"{where} is not the objects file {out} was computed with (its checksum "
                                     "differs); pass that file with --objects FILE, or --no-boxes")
        ob = ob.limited(n)
    frame_shape = (n, ob.boxes.height, ob.boxes.width, ob.boxes.boxes.shape[1])
    check_aligned(ob, n, (cfg.get("frame_shape") and _nhwc_frame(cfg)) or frame_shape)
    return ob.boxes


def _nhwc_frame(cfg) -> tuple:
    """The job's (H, W, C) frame shape, whatever layout the model read it in."""
    from jaxsal.io.layout import to_nhwc_shape

    return to_nhwc_shape((int(cfg["n"]),) + tuple(cfg["frame_shape"]), cfg.get("layout", "NHWC"))


class _Array:
    """Frames given in memory, as a source (for the layout check)."""

    def __init__(self, a):
        self.a, self.shape = a, a.shape

    def read(self, i, j):
        return self.a[i:j]


def _captions(out, start: int, stop: int, load_outputs) -> dict:
    """Row i (relative to start) -> "frame F | action a | Q_a = v" from the job's stored outputs; for a
    target that explains no action (value): "frame F | target value: no action | V = v"."""
    try:
        o = load_outputs(out, allow_incomplete=True)
    except SaliencyInputError:
        return {}
    from jaxsal.io.store import read_manifest

    vec_key = "q" if "q" in o else ("logits" if "logits" in o else None)
    target = None if "action" in o else read_manifest(out)["config"].get("target")
    res = {}
    for r, f in enumerate(o.get("frame", [])):
        if not start <= f < stop:
            continue
        if "action" in o:
            a = int(o["action"][r])
            text = f"frame {int(f)} | action {a}"
            if vec_key is not None:
                text += f" | {'Q' if vec_key == 'q' else 'logit'}_{a} = {float(o[vec_key][r][a]):.3g}"
        else:
            text = f"frame {int(f)} | target {target}: no action"
            if "value" in o:
                text += f" | V = {float(o['value'][r]):.3g}"
        res[int(f) - start] = text
    return res


def _esc_num(v, fmt: str = "") -> str:
    """A number formatted with `fmt`, anything else (a crafted summary's string) as text; escaped."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    return html.escape(format(v, fmt) if ok else str(v))


def _html(manifest, names, scales, pngs, vids, start, stop, summaries=()) -> str:
    """index.html of a gallery. Every value from the output folder (manifest, summaries: files a
    folder from someone else may have crafted) is HTML-escaped, in text and in attributes."""
    cfg = manifest["config"]
    esc = html.escape

    def rates(s):
        m = s.get("maps_per_s") if isinstance(s, dict) else None
        return ", ".join(f"{k} {v}" for k, v in m.items()) if isinstance(m, dict) else str(m)

    runs = "".join(
        f"<li>process {_esc_num(s.get('process_id'))}: {_esc_num(s.get('frames_computed'))} frames in "
        f"{_esc_num(s.get('wall_s'), '.1f')}s on {_esc_num(s.get('devices'))} device(s); maps/s: "
        + esc(rates(s)) + "</li>" for s in summaries if isinstance(s, dict))
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(str(cfg['methods'][k]['method']))}</td>"
                   f"<td><code>{esc(json.dumps(cfg['methods'][k]['options']))}</code></td>"
                   f"<td>{esc(scales[k].describe())}</td></tr>" for k in names)
    media = []
    for v in vids:
        if v.suffix == ".mp4":
            media.append(f'<h2>Episode video</h2><video controls loop width="100%" src="{esc(v.name)}"></video>')
        else:
            media.append(f'<h2>Episode GIF</h2><img src="{esc(v.name)}" alt="episode gif">')
    imgs = "".join(f'<h2>{esc(p.stem.replace("_", " "))}</h2><img src="{esc(p.name)}" alt="{esc(p.stem)}">'
                   for p in pngs)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jaxsal gallery</title>
<style>body{{font-family:sans-serif;margin:2em;background:#111;color:#eee}}img,video{{max-width:100%;
image-rendering:pixelated}}td,th{{border:1px solid #555;padding:4px}}table{{border-collapse:collapse}}
code{{color:#9cf}}</style></head><body>
<h1>jaxsal saliency gallery</h1>
<p>Agent <b>{esc(str(cfg.get('agent')))}</b>, target <b>{esc(str(cfg.get('target')))}</b>,
frames {_esc_num(start)}&ndash;{_esc_num(stop - 1)} of {_esc_num(cfg['n'])}; jaxsal {esc(str(manifest.get('version')))},
created {esc(str(manifest.get('created')))}.</p>
<ul>{runs}</ul>
<table><tr><th>name</th><th>method</th><th>options</th><th>colour scale (fixed over the video)</th></tr>
{rows}</table>
{''.join(media)}
{imgs}
</body></html>
"""
