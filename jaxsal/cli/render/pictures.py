"""Pictures of saliency maps: overlays, PNG grids, per-stacked-frame views, object-effect bars, MP4/GIF
videos (colour scales: jaxsal.cli.render.scale).

Jobs run with `--objects` have boxes per stacked frame: grids and videos outline the newest
frame's objects on the frame and on every overlay (class colours, legend below), the
per-stacked-frame view each frame's own objects. Jobs run with `--objects --effects` also get,
for the states of the per-stacked-frame views, effects_XXXXXX.png: the frame, the overlays and
boxes, and a bar per class of how much the explained output drops when the class is removed
(thick outline and "flips": the greedy action changes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from jaxsal.cli.render._draw import (eff_scale, fit, flat_map, grey_planes, grey_rgb, label, last_frame, resize,
                                     save_png, text_width, up)
from jaxsal.cli.render.scale import Scale, greydanus_overlay, legend
from jaxsal.errors import SaliencyInputError


def check_maps(maps: dict, n: int):
    if not maps:
        raise SaliencyInputError("nothing to render: no maps given")
    for k, m in maps.items():
        if len(m) != n:
            raise SaliencyInputError(f"maps {k!r} have {len(m)} entries but there are {n} frames")


def _outlined(tile: np.ndarray, scale: int, boxes, i: int, frame: int = -1) -> np.ndarray:
    """An upscaled tile with stacked frame `frame`'s object boxes of state i (ObjectBoxes) outlined."""
    if boxes is None:
        return tile
    from jaxsal.game_objects.draw import outline

    return outline(tile, boxes.boxes[i, frame], boxes.labels[i, frame], scale)


def composite(frames, maps: dict, scales: dict, i: int, scale: int = 3, labels: bool = True,
              greydanus: tuple | None = None, boxes=None) -> np.ndarray:
    """One row: frame | overlay per method (| Greydanus actor/critic view), RGB uint8; with
    `boxes` (jaxsal.game_objects.ObjectBoxes aligned with `frames`) the newest frame's objects outlined."""
    f = last_frame(frames[i])
    tiles = [("frame", grey_rgb(f))]
    for k, m in maps.items():
        tiles.append((k, scales[k].overlay(f, resize(flat_map(m[i]), f.shape))))
    if greydanus is not None:
        a, c = greydanus
        tiles.append((f"{a}(blue)/{c}(red)", greydanus_overlay(
            f, resize(flat_map(maps[a][i]), f.shape), resize(flat_map(maps[c][i]), f.shape),
            scales[a], scales[c])))
    scale = eff_scale(scale, f.shape[0])
    ups = [(name, _outlined(up(t, scale), scale, boxes, i)) for name, t in tiles]
    out = [label(t, name) if labels else t for name, t in ups]
    return np.concatenate(out, 1)


def _box_legend(boxes, width: int) -> np.ndarray:
    if boxes is None:
        return np.zeros((0, width, 3), np.uint8)
    from jaxsal.game_objects.draw import class_legend

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
        rows.append(label(row, (captions or {}).get(int(i), f"frame {int(i)}")))
    grid = np.concatenate(rows, 0)
    return save_png(path, np.concatenate([grid, _box_legend(boxes, grid.shape[1]),
                                          legend(scales, grid.shape[1])], 0))


def stack_png(path, frames, maps: dict, i: int, scheme: str = "auto", scale: int = 3,
              scales: dict | None = None, boxes=None) -> Path:
    """Per-stacked-frame view of state i: columns = the stacked frames (oldest to newest), rows = the
    raw frames, then each method's map over every frame: its per-frame maps (frame j's own map on
    frame j) when it has them, else the one map of the stack drawn over each frame; the colour bars
    below. `scales` should be fitted to what is drawn (per-frame maps: to per-frame maps, see
    render_dir); `boxes`: each stacked frame's own objects outlined."""
    stack = grey_planes(frames[i])
    c = stack.shape[-1]
    scale = eff_scale(scale, stack.shape[0])
    if boxes is not None and boxes.boxes.shape[1] != c:
        boxes = None  # boxes for another stack depth: nothing to align them with
    rows = [np.concatenate([label(_outlined(up(grey_rgb(stack[..., j]), scale), scale, boxes, i, j),
                                  f"t-{c - 1 - j}") for j in range(c)], 1)]
    width = rows[0].shape[1]
    used = {}
    for k, m in maps.items():
        mi = np.asarray(m[i], np.float64)
        each = mi.ndim == 3 and mi.shape[-1] == c  # the stacked frames' own maps
        sc = used[k] = (scales or {}).get(k) or Scale(np.moveaxis(mi, -1, 0) if each else flat_map(mi), scheme)
        if each:
            planes = [resize(mi[..., j], stack.shape[:2]) for j in range(c)]
            text = f"{k}: each stacked frame's own map"
        else:
            planes = [resize(flat_map(mi), stack.shape[:2])] * c
            text = f"{k}: one map for the whole stack, drawn over each frame{_per_frame_hint(k)}"
        tiles = [_outlined(up(sc.overlay(stack[..., j], planes[j]), scale), scale, boxes, i, j) for j in range(c)]
        rows.append(label(np.concatenate(tiles, 1), text))
    rows.append(_box_legend(boxes, width))
    rows.append(legend(used, width))
    return save_png(path, np.concatenate(rows, 0))


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
    from jaxsal.game_objects.draw import colour

    sym = TARGET_SYMBOL.get(str(target), str(target))
    title = f"{sym} drop when removed" + (f" (action {action})" if action is not None and sym in ("Q", "logit") else "")
    img = Image.fromarray(np.full((height, width, 3), 255, np.uint8))
    d = ImageDraw.Draw(img)
    d.text((4, 2), fit(title, width - 8), fill=(0, 0, 0))
    eff = np.asarray(effect, np.float64)
    here = np.asarray(present, bool) & np.isfinite(eff)
    top = float(np.abs(eff[here]).max()) if here.any() else 0.0
    top = top or 1.0
    name_w = int(min(width // 3, max([text_width(str(c)) for c in classes] + [20]) + 8))
    value_w = int(text_width("-0.000e-00 flips")) + 8                 # the values, in a column on the right
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
        d.text((4, yc + (row_h - 11) // 2), fit(str(name), name_w - 6), fill=(0, 0, 0))
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
            d.text((x1 + 6, yc + 10), fit(flag, value_w - 8), fill=FLAG_COLOUR)
    foot = min(height - 12, y + row_h * c + 2)
    d.text((4, foot), fit("thick outline, \"flips\": the greedy action changes", width - 8), fill=(90, 90, 90))
    if (kept >= 0.05).any() or left.any():
        note = "kept: inside other boxes; residue: pixels left" + ("" if row_h >= 21 else " (*)")
        d.text((4, min(height - 12, foot + 12)), fit(note, width - 8), fill=(90, 90, 90))
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
    pic = label(np.concatenate([pic, bars], 1), caption or f"frame {i}")
    return save_png(path, np.concatenate([pic, _box_legend(boxes, pic.shape[1]), legend(scales, pic.shape[1])], 0))


def video(path, frames, maps: dict, scheme: str = "auto", fps: int = 15, scale: int = 3,
          greydanus: tuple | None = None, scales: dict | None = None, captions: dict | None = None,
          first: int = 0, boxes=None) -> Path:
    """MP4 or GIF (by suffix) of frame | overlays for every frame, colour scale fixed over the video;
    each frame is captioned with its index (and the action and Q-value given `captions`), with the
    colour bars below."""
    path = Path(path)
    n = len(frames)
    check_maps(maps, n)
    scales = scales or {k: Scale(np.stack([flat_map(x) for x in m]), scheme) for k, m in maps.items()}

    def frame_img(i):
        row = composite(frames, maps, scales, i, scale=scale, greydanus=greydanus, boxes=boxes)
        row = label(row, (captions or {}).get(i, f"frame {first + i}"))
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
