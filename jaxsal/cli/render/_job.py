"""A job's input frames and object boxes, found from its manifest (for the pictures of a job and of a
sweep's cells) and checked to be the ones it was computed with."""
from __future__ import annotations

from pathlib import Path

from jaxsal.errors import SaliencyInputError


def _candidates(out, stored) -> list[Path]:
    """Where a file the manifest names may be: its path (absolute in new jobs); for a relative path (older
    jobs recorded it relative to where `jaxsal explain` ran) that path from here, then from the output
    directory and each directory above it."""
    p = Path(stored)
    if p.is_absolute():
        return [p]
    here = Path(out).absolute()
    return list(dict.fromkeys([p, here / p, *(d / p for d in here.parents)]))


def job_input(out, manifest):
    """The job's input as a source, found by `_candidates` and checked against the job's input checksum
    (a buffer rewritten or replaced since the job is refused, never drawn under the maps)."""
    from jaxsal.io import open_source

    from jaxsal.io.store import MANIFEST

    cfg = manifest["config"]
    if "input" not in cfg:  # every job records it (store.read_manifest checked its kind): the frames are checked by it
        raise SaliencyInputError(f"{Path(out) / MANIFEST} is corrupt (it has no input entry, which `jaxsal explain` "
                                 "writes); pass the job's frames with render --input PATH")
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


def job_boxes(out, manifest, path=None):
    """The ObjectBoxes of a job's frames (all N), or None for a job without --objects and no `path`.
    The job's own objects file, or `path`, which must be the file the job used (same checksum)."""
    from jaxsal.io.object_files import check_aligned, read_objects

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
