"""The gallery of a `jaxsal explain` output directory: PNG grid, per-stacked-frame views, object
effects, videos and an index.html."""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from jaxsal.cli.render._draw import check_drawing, flat_map
from jaxsal.cli.render._job import job_boxes, job_input
from jaxsal.cli.render.pictures import check_maps, effects_png, grid_png, stack_png, video
from jaxsal.cli.render.scale import SCHEMES, Scale
from jaxsal.errors import SaliencyInputError, brief


def _check_finite(out: Path, maps: dict, start: int, chunk: int):
    """A job's maps hold no NaN or inf (jaxsal explain writes none): one that does names its damaged
    chunk file, which a rerun of the job recomputes once deleted."""
    from jaxsal.io.store import chunk_path

    for k, m in maps.items():
        bad = np.flatnonzero(~np.isfinite(np.asarray(m, np.float64)).reshape(len(m), -1).all(1))
        if bad.size:
            i = start + int(bad[0])
            raise SaliencyInputError(f"{chunk_path(out, k, i // chunk)}: its maps hold NaN or inf (frame {i}), which "
                                     "jaxsal explain never writes: the file was damaged or edited; delete it and rerun "
                                     "the same jaxsal explain command, which computes that chunk again")


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
    from jaxsal.io.store import check_frames_held, finished_frames, load_maps, load_outputs, read_manifest

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
    source = job_input(out, manifest) if frames is None else None
    if source is not None:  # before n sizes anything: bounded by what the input holds
        check_frames_held(out, n, len(source), source.describe().get("path"))
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
        frames = as_layout(source, "NHWC").read(start, stop)
    else:
        frames = np.asarray(frames)
        frames = as_layout(_Array(frames), "NHWC").read(start, min(stop, len(frames)))
    maps = {k: load_maps(out, k, allow_incomplete=True)[start:stop] for k in names}
    check_maps(maps, len(frames))
    _check_finite(out, maps, start, int(cfg["chunk"]))
    ob = job_boxes(out, manifest, objects) if boxes else None   # None: a job without --objects
    ob = ob[start:start + len(frames)] if ob is not None else None
    if scheme not in SCHEMES:
        raise SaliencyInputError(f"--scheme must be one of {SCHEMES}, got {scheme!r}")
    scales = {k: Scale(np.stack([flat_map(x) for x in m]), scheme) for k, m in maps.items()}
    eff = None
    if "effects" in cfg.get("objects", {}):  # read (and checked) before anything is written
        from jaxsal.io.object_files import load_object_effects

        eff = load_object_effects(out, allow_incomplete=True)
    check_drawing(scale, frames.shape[1:3], grid_frames, fps)
    summaries = _summaries(out)
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
    if eff is not None:  # --effects: one figure per shown state, its effects beside its maps
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
    page = gallery / "index.html"
    page.write_text(_html(manifest, names, scales, pngs, vids, start, stop, summaries))
    return {"html": page, "pngs": pngs, "videos": vids}


def _summaries(out: Path) -> list:
    """The job's summary-p*.json files (timings, shown on the page); a damaged one is a clear error: it only
    records timings, and the same `jaxsal explain` writes it again once it is deleted."""
    res = []
    for p in sorted(out.glob("summary-p*.json")):
        try:
            res.append(json.loads(p.read_text()))
        except (ValueError, IsADirectoryError) as e:
            raise SaliencyInputError(f"{p} is corrupt ({brief(e)}): delete it "
                                     "and rerun the same `jaxsal explain` command, which writes it again "
                                     "(it holds only timings)") from None
    return res


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
