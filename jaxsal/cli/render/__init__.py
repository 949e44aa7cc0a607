"""`jaxsal render DIR`: PNG grids, per-stacked-frame views, videos and an HTML gallery of an explain
output (jaxsal.cli.render.gallery), or the curves and grid of a sweep (jaxsal.cli.render.sweep)."""
from __future__ import annotations

import time

from jaxsal.cli._common import say
from jaxsal.errors import CLIError


def _frame_range(text: str | None):
    if not text:
        return 0, None
    a, _, b = text.partition(":")
    try:
        return int(a or 0), (int(b) if b else None)
    except ValueError:
        raise CLIError(f"--frames {text!r}: use START:STOP, e.g. 0:400") from None


def cmd_render(args) -> int:
    from jaxsal.cli.render.gallery import render_dir
    from jaxsal.cli.render.sweep import is_sweep_dir, render_sweep

    start, stop = _frame_range(args.frames)
    if is_sweep_dir(args.dir):  # a `jaxsal sweep` DIR: metric curves and a grid of one frame per cell
        t = time.perf_counter()
        res = render_sweep(args.dir, gallery=args.out, methods=args.methods.split(",") if args.methods else None,
                           frame=start, scheme=args.scheme, scale=args.scale)
        say(f"rendered the sweep's curves ({len(res['panels'])} panels) and grid ({len(res['grid'].rows)} rows x "
            f"{len(res['grid'].methods)} methods) in {time.perf_counter() - t:.1f}s; open {res['html']}", args.quiet)
        return 0
    frames = None
    if args.input:
        from jaxsal.io import open_source
        from jaxsal.io.readers import verify_input

        from jaxsal.io.store import check_frames_held, read_manifest

        src = open_source(args.input)
        check_frames_held(args.dir, read_manifest(args.dir)["config"]["n"], len(src), args.input)
        verify_input(src)  # frames of corrupt bytes would be drawn as the job's
        frames = src.read(0, min(len(src), stop or len(src)))
    videos = () if args.video == "none" else tuple(v.strip() for v in args.video.split(",") if v.strip())
    for v in videos:
        if v not in ("mp4", "gif"):
            raise CLIError(f"--video {args.video!r}: use mp4, gif, mp4,gif or none")
    grey = tuple(args.greydanus.split(",")) if args.greydanus else None
    if grey is not None and len(grey) != 2:
        raise CLIError("--greydanus takes two names: ACTOR,CRITIC")
    t = time.perf_counter()
    res = render_dir(args.dir, methods=args.methods.split(",") if args.methods else None, gallery=args.out,
                     frames=frames, start=start, stop=stop, grid_frames=args.grid_frames, videos=videos,
                     scheme=args.scheme, fps=args.fps, scale=args.scale, greydanus=grey,
                     objects=args.objects, boxes=not args.no_boxes)
    say(f"rendered {len(res['pngs'])} PNG(s) and {len(res['videos'])} video(s) in "
        f"{time.perf_counter() - t:.1f}s; open {res['html']}", args.quiet)
    return 0


def add_parser(sub):
    """The `jaxsal render` command and its flags."""
    r = sub.add_parser("render", help="PNG grids, videos and an HTML gallery of an explain output")
    r.add_argument("dir", help="output directory of `jaxsal explain`, or of `jaxsal sweep` (then: curves.png, "
                               "each metric against checkpoint, and grid.png, frame START of --frames in every "
                               "cell)")
    r.add_argument("--methods", help="comma list of methods to show (default all)")
    r.add_argument("--out", help="gallery directory (default DIR/gallery)")
    r.add_argument("--frames", help="START:STOP range of frames (videos are capped at 1000 frames)")
    r.add_argument("--input", help="frames to draw on, if the job's input moved")
    r.add_argument("--video", default="mp4,gif", help="mp4, gif, mp4,gif or none")
    r.add_argument("--scheme", default="auto", choices=["auto", "signed", "heat", "abs"],
                   help="colour scale: signed (green +, red -), heat (non-negative; on signed maps it drops the "
                        "negative values and says how much), abs (|m| Gaussian-smoothed, as Greydanus / Paper A "
                        "show gradients), auto (signed if the maps have negative values, else heat)")
    r.add_argument("--greydanus", help="ACTOR,CRITIC: Greydanus colouring (actor blue, critic red) in videos")
    r.add_argument("--grid-frames", type=int, default=6)
    r.add_argument("--fps", type=int, default=15)
    r.add_argument("--scale", type=int, default=3, help="pixel upscaling of the pictures")
    r.add_argument("--objects", metavar="FILE", help="the objects file of a job run with --objects, if it moved "
                                                     "(or boxes to draw on a job without them)")
    r.add_argument("--no-boxes", action="store_true", help="do not draw the object boxes of a job run with --objects")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_render)
