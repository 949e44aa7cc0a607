"""Pictures of a `jaxsal sweep` output DIR (`jaxsal render DIR` on a sweep: recognised by its DIR/sweep.json).

- curves.png: each metric against the checkpoint (training progress), one panel per metric, one
  colour per method, one line style per agent x input; x is the number in the checkpoint's name
  where every checkpoint has one (tiny0, step_20000), else the checkpoints' order.
- grid.png: one frame per cell, rows = agent / checkpoint / input, columns = the frame and one
  overlay per method, each method's colour scale fixed over its column (comparable down the
  checkpoints); a cell that has no maps (failed, pending) is a grey tile saying so.

The layouts (`curve_panels`, `grid_layout`) are pure functions of the table; the drawing reuses the
drawing helpers of a job's pictures (jaxsal.cli.render._draw).
"""
from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import numpy as np

from jaxsal.cli.render._draw import (check_drawing, eff_scale, flat_map, grey_rgb, label, last_frame, resize,
                                     save_png, up, wrap)
from jaxsal.cli.render._job import job_input
from jaxsal.cli.render.scale import Scale, legend
from jaxsal.errors import SaliencyInputError

NOT_METRICS = ("seed", "frames", "seconds")
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def is_sweep_dir(out) -> bool:
    from jaxsal.io.sweep import CONFIG_JSON

    return (Path(out) / CONFIG_JSON).is_file()


def metric_columns(table: dict) -> list[str]:
    """The numeric columns of the table worth a panel: statistics and metrics with a finite value
    (a `*_defined` share only where some frames' score was undefined)."""
    from jaxsal.io.sweep import STRING_COLUMNS

    def shown(k, v):
        v = np.asarray(v, np.float64)
        return np.isfinite(v).any() and not (k.endswith("_defined") and (v[np.isfinite(v)] == 1).all())
    return [k for k, v in table.items() if k not in STRING_COLUMNS and k not in NOT_METRICS and shown(k, v)]


def checkpoint_positions(checkpoints) -> tuple[dict, str]:
    """({checkpoint: x}, axis label): the last integer of each name where all have one, else their order
    of first appearance (the table's order: a glob's checkpoints in natural order)."""
    names = list(dict.fromkeys(str(c) for c in checkpoints))
    nums = [re.findall(r"\d+", c) for c in names]
    if all(nums) and len({int(n[-1]) for n in nums}) == len(names):
        return {c: float(n[-1]) for c, n in zip(names, nums)}, "checkpoint (the number in its name)"
    return {c: float(i) for i, c in enumerate(names)}, "checkpoint (in the sweep's order)"


@dataclasses.dataclass
class Line:
    method: str
    group: str          # "agent / input"
    x: list
    y: list


@dataclasses.dataclass
class Panel:
    metric: str
    lines: list


def curve_panels(table: dict, metrics=None) -> tuple[list[Panel], dict, str]:
    """(panels, {checkpoint: x}, x label): one Panel per metric, in it one Line per method x
    (agent / input) with the rows that are ok, sorted by x."""
    ok = np.asarray(table["status"]) == "ok"
    metrics = metric_columns({k: np.asarray(v)[ok] for k, v in table.items()}) if metrics is None else list(metrics)
    for m in metrics:
        if m not in table:
            raise SaliencyInputError(f"the sweep's table has no column {m!r}")
    pos, xlabel = checkpoint_positions(table["checkpoint"])
    methods = list(dict.fromkeys(table["method"]))
    groups = list(dict.fromkeys(f"{a} / {i}" for a, i in zip(table["agent"], table["input"])))
    panels = []
    for m in metrics:
        lines = []
        for meth in methods:
            for g in groups:
                rows = [r for r in range(len(ok)) if ok[r] and table["method"][r] == meth
                        and f"{table['agent'][r]} / {table['input'][r]}" == g]
                pts = sorted((pos[str(table["checkpoint"][r])], float(table[m][r])) for r in rows)
                if pts:
                    lines.append(Line(meth, g, [p[0] for p in pts], [p[1] for p in pts]))
        panels.append(Panel(m, lines))
    return panels, pos, xlabel


def curves_png(path, panels: list[Panel], pos: dict, xlabel: str, columns: int = 3):
    """Draw the panels (matplotlib, Agg) into `path`; returns (path, the figure's axes that hold a panel)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not any(p.lines for p in panels):
        raise SaliencyInputError("nothing to draw: the sweep has no finished cell with a metric")
    cols = min(columns, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    methods = list(dict.fromkeys(ln.method for p in panels for ln in p.lines))
    groups = list(dict.fromkeys(ln.group for p in panels for ln in p.lines))
    colours = plt.get_cmap("tab10")
    used = []
    for k, p in enumerate(panels):
        ax = axes[k // cols][k % cols]
        for ln in p.lines:
            mi, gi = methods.index(ln.method), groups.index(ln.group)
            label = ln.method if len(groups) == 1 else f"{ln.method} ({ln.group})"
            ax.plot(ln.x, ln.y, STYLES[gi % len(STYLES)], marker=MARKERS[gi % len(MARKERS)], markersize=4,
                    color=colours(mi % 10), label=label)
        ax.set_title(p.metric, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
        if len(pos) <= 12:
            ax.set_xticks(sorted(set(pos.values())))
            if "order" in xlabel:
                ax.set_xticklabels([c for c, _ in sorted(pos.items(), key=lambda kv: kv[1])], rotation=30,
                                   fontsize=7)
        ax.tick_params(labelsize=7)
        used.append(ax)
    for k in range(len(panels), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = used[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(labels) - 1) // 4), 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, used


@dataclasses.dataclass
class GridLayout:
    rows: list           # [(agent, checkpoint, input), ...] in the table's order
    methods: list        # the columns after the frame
    cells: dict          # (row index, method) -> the cell's folder under DIR (None: no maps)


def grid_layout(table: dict, methods=None) -> GridLayout:
    """Rows = agent x checkpoint x input, columns = methods; a cell with status other than ok has None."""
    all_methods = list(dict.fromkeys(table["method"]))
    methods = all_methods if methods is None else list(methods)
    for m in methods:
        if m not in all_methods:
            raise SaliencyInputError(f"the sweep has no method {m!r}; it has {', '.join(all_methods)}")
    rows = list(dict.fromkeys(zip(table["agent"], table["checkpoint"], table["input"])))
    cells = {}
    for r in range(len(table["method"])):
        key = (table["agent"][r], table["checkpoint"][r], table["input"][r])
        if table["method"][r] in methods:
            cells[(rows.index(key), table["method"][r])] = (
                "/".join(("cells",) + tuple(key) + (table["method"][r],)) if table["status"][r] == "ok" else None)
    return GridLayout([tuple(map(str, r)) for r in rows], methods, cells)


def _cell_frame_and_map(out: Path, cell: str, method: str, frame: int):
    """(the frame stack, its map) of frame `frame` of a finished cell's job."""
    from jaxsal.io.layout import as_layout
    from jaxsal.io.store import load_maps, read_manifest
    from jaxsal.io.sweep import JOB

    job = out / cell / JOB
    manifest = read_manifest(job)
    n = int(manifest["config"]["n"])
    if not 0 <= frame < n:
        raise SaliencyInputError(f"frame {frame} is not in {cell} (it has {n} frames); choose --frames F: with "
                                 f"F < {n}")
    x = as_layout(job_input(job, manifest), "NHWC").read(frame, frame + 1)[0]
    return x, np.asarray(load_maps(job, method)[frame])


def grid_png(path, out, layout: GridLayout, frame: int = 0, scheme: str = "auto", scale: int = 3):
    """Draw the grid of `layout` (frame `frame` of every cell) into `path`; returns (path, tile (h, w))."""
    from PIL import Image, ImageDraw

    out = Path(out)
    got = {k: _cell_frame_and_map(out, c, k[1], frame) for k, c in layout.cells.items() if c is not None}
    if not got:
        raise SaliencyInputError(f"{out}: no cell is finished yet; nothing to draw")
    first = last_frame(next(iter(got.values()))[0])
    check_drawing(scale, first.shape)
    s = eff_scale(scale, first.shape[0])
    h, w = first.shape[0] * s, first.shape[1] * s
    scales = {}
    for m in layout.methods:
        ms = [flat_map(got[k][1]) for k in got if k[1] == m]
        if ms:
            scales[m] = Scale(np.stack([resize(x, first.shape) for x in ms]), scheme)

    def empty(text):
        """A grey tile saying why it has no map (white text, wrapped)."""
        img = Image.new("RGB", (w, h), (90, 90, 90))
        d = ImageDraw.Draw(img)
        for k, line in enumerate(wrap(text, w - 4)):
            d.text((2, 2 + 12 * k), line, fill=(255, 255, 255))
        return np.asarray(img)

    rows = []
    for r, (agent, ckpt, inp) in enumerate(layout.rows):
        have = [got[(r, m)] for m in layout.methods if (r, m) in got]
        f = last_frame(have[0][0]) if have else None
        tiles = [label(up(grey_rgb(f), s) if f is not None else empty("no finished cell"), "frame")]
        for m in layout.methods:
            if (r, m) in got:
                img = up(scales[m].overlay(f, resize(flat_map(got[(r, m)][1]), f.shape)), s)
            else:
                img = empty("not run" if (r, m) not in layout.cells else "no map (failed or pending)")
            tiles.append(label(img, m))
        rows.append(label(np.concatenate(tiles, 1), f"{agent} / {ckpt} / {inp} | frame {frame}"))
    img = np.concatenate(rows, 0)
    img = np.concatenate([img, legend(scales, img.shape[1])], 0)
    return save_png(path, img), (h, w)


def render_sweep(out, gallery=None, methods=None, metrics=None, frame: int = 0, scheme: str = "auto",
                 scale: int = 3) -> dict:
    """curves.png and grid.png (and an index.html) of a sweep DIR into `gallery` (default DIR/gallery).
    Returns {"html", "pngs", "videos": [], "panels", "grid"} (the layouts drawn)."""
    from jaxsal.io.sweep import load_sweep

    out = Path(out)
    table = load_sweep(out)
    gallery = Path(gallery) if gallery is not None else out / "gallery"
    if not (np.asarray(table["status"]) == "ok").any():
        raise SaliencyInputError(f"{out}: no cell is finished yet (none has status ok in {out / 'results.csv'}); "
                                 "run the sweep (its command again resumes it) before rendering")
    layout = grid_layout(table, methods)  # checks the methods first
    panels, pos, xlabel = curve_panels(table, metrics)
    panels = [Panel(p.metric, [ln for ln in p.lines if ln.method in layout.methods]) for p in panels]
    grid, _ = grid_png(gallery / "grid.png", out, layout, frame=frame, scheme=scheme, scale=scale)  # checks scale
    curves, _ = curves_png(gallery / "curves.png", panels, pos, xlabel)
    page = gallery / "index.html"
    esc = html.escape
    ok = int((np.asarray(table["status"]) == "ok").sum())
    page.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jaxsal sweep</title>
<style>body{{font-family:sans-serif;margin:2em;background:#111;color:#eee}}img{{max-width:100%;
image-rendering:pixelated;background:#fff}}</style></head><body>
<h1>jaxsal sweep {esc(str(out))}</h1>
<p>{esc(str(ok))} of {esc(str(len(table['status'])))} cells ok;
table: <code>{esc(json.dumps(str(out / 'results.csv')))}</code></p>
<h2>Metrics against checkpoint</h2><img src="{esc(curves.name)}" alt="curves">
<h2>One frame per cell (frame {esc(str(frame))})</h2><img src="{esc(grid.name)}" alt="grid">
</body></html>
""")
    return {"html": page, "pngs": [curves, grid], "videos": [], "panels": panels, "grid": layout}
