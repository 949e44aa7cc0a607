"""The object files of a batch job: the boxes file `jaxsal explain --objects` reads, and the per-frame
object shares (how much of each map falls on each game object class, next to or instead of the maps)
and object effects it writes and `jaxsal.load_object_shares` / `load_object_effects` read back.

Boxes come from an objects file aligned with the input buffer (frame i of the buffer <-> state i
of the file), the `.npz` that `jaxsal.game_objects.ObjectBoxes.save` writes (no pickle):

    boxes    (N, F, K, 4) int16   per state, per stacked frame (oldest first, as the frame stack's
                                  channels), up to K boxes as half-open (y0, x0, y1, x1) pixel rows
                                  and columns of the agent's frame (e.g. 84x84)
    labels   (N, F, K)    int8    class index of each box, -1 = padding (unused slot)
    classes  (C,)         str     class names, e.g. ["ball", "player", "enemy"]
    size     (2,)         int     frame height and width (optional, default 84x84)
    game     ()           str     game name (optional; checked against the agent's game)

Frames played by jaxsal from ale-py carry RAM-derived boxes (`python -m jaxsal_agents.record_objects`
writes DIR/obs.npy and DIR/obs.objects.npz); `--objects` without a FILE takes the file beside the
input: `buf.npy` -> `buf.objects.npz`, a shard directory `replay/` -> `replay.objects.npz`.

Per method and chunk the job writes DIR/_objects/<method>/chunk_XXXXXXX.npz (atomically, like
the maps, so a killed job resumes without losing or repeating frames) with, for C classes and F
stacked frames: `positive`, `absolute`, `chance` (n, C) float32 (`jaxsal.metrics.object_attribution`),
`present` (n, C) bool (the class is on screen), `pointing` (n, C) bool (the map's maximum lies on
the class, `jaxsal.metrics.object_pointing`) and `per_frame_positive/absolute/chance` (n, F, C):
for per-frame maps (`--option M.per_frame=true`) frame f's map on frame f's objects over the whole
map's mass (these sum over f to `positive`); for maps summed over the stack, the map's share on
frame f's objects alone (which frame's object positions the map covers; they need not sum to the
union's share). `jaxsal.load_object_shares(DIR, method)` reads them back.

With `--effects` the job also removes each object class from each state (`jaxsal.metrics.object_effects`,
the job's --target and the actions the maps explain, the same boxes) and writes, once per chunk for all
methods, DIR/_objects/_effects/chunk_XXXXXXX.npz: `effect` (n, C) float32 (the explained output minus
that without the class: how much it drops), `flips` (n, C) bool (the greedy action changes), `present`
(n, C) bool, `score` (n,) float32 and `action` (n,) int32 (the original state's explained output and
action), and what each removal did: `overlap` (n, C) float32 (the share of the class's box pixels inside
other classes' boxes, kept), `residue` (n, C) int32 and `residue_share` (n, C) float32 (non-background
pixels left in its boxes grown by 2 px). The removal is `object_effects`' default: every stacked frame,
the ring-median fill. `jaxsal.load_object_effects(DIR)` reads them, `load_object_shares(DIR, method, effects=True)`
returns them with the shares.
"""
from __future__ import annotations

import dataclasses
import json
import zipfile
import zlib
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from jaxsal.errors import SaliencyInputError, brief, name_fault

if TYPE_CHECKING:
    from jaxsal.game_objects import ObjectBoxes

OBJECTS = "_objects"
FORMAT_HELP = ("an .npz with boxes (N, F, K, 4) int16 (y0, x0, y1, x1), labels (N, F, K) int8 (-1 = none) and "
               "classes (C,) str; see `jaxsal.io.object_files` or docs/guides/objects.md")
RECORD_HINT = "python -m jaxsal_agents.record_objects --agent NAME --steps N --out DIR (writes DIR/obs.npy and its boxes)"
EFFECTS = "_effects"       # DIR/_objects/_effects: method aliases may not start with "_"
EFFECT_KEYS = ("effect", "flips", "present", "score", "action", "overlap", "residue", "residue_share")
REMOVAL_KEYS = ("overlap", "residue", "residue_share")      # what each removal did (not in older jobs' files)
EFFECTS_CONFIG = {"fill": "ring", "frames": "all", "margin": 2, "ring_width": 3}   # object_effects' defaults
SHARE_KEYS = ("positive", "absolute", "chance", "present", "pointing",
              "per_frame_positive", "per_frame_absolute", "per_frame_chance")


def objects_path(out, alias: str, index: int) -> Path:
    return Path(out) / OBJECTS / alias / f"chunk_{index:07d}.npz"


def effects_path(out, index: int) -> Path:
    return Path(out) / OBJECTS / EFFECTS / f"chunk_{index:07d}.npz"


def beside(input_path) -> Path:
    """Where `--objects` without a FILE looks for the boxes of an input buffer."""
    p = Path(input_path)
    if p.is_dir() or p.suffix not in (".npy", ".npz"):
        return p.parent / f"{p.name}.objects.npz"
    return p.with_suffix(".objects.npz")


def _fingerprint(path: Path) -> str:
    from jaxsal.io.readers import _fingerprint_files
    return _fingerprint_files([path])


@dataclasses.dataclass
class ObjectsInput:
    """The boxes of a job's frames: an ObjectBoxes aligned with the input, where it came from."""
    boxes: "ObjectBoxes"
    path: str | None = None
    game: str | None = None
    checksum: str | None = None
    effects: bool = False   # also the causal effects of removing each class (--effects)

    @property
    def classes(self) -> tuple:
        return self.boxes.classes

    def limited(self, n: int) -> "ObjectsInput":
        """The boxes of the first n states (for `--limit`)."""
        return dataclasses.replace(self, boxes=self.boxes[:n], checksum=f"{self.checksum}[:{n}]")

    def config(self) -> dict:
        """What decides the shares (compared when a job is resumed)."""
        cfg = {"checksum": self.checksum, "classes": list(self.classes), "frames": int(self.boxes.boxes.shape[1])}
        if self.effects:  # only then: configs of jobs without effects stay as they were
            cfg["effects"] = dict(EFFECTS_CONFIG)
        return cfg

    def describe(self) -> dict:
        d = {"path": self.path, "game": self.game, "classes": list(self.classes),
             "files": f"{OBJECTS}/<method>/chunk_XXXXXXX.npz: per-frame object shares (jaxsal.load_object_shares)"}
        if self.effects:
            d["effects_files"] = (f"{OBJECTS}/{EFFECTS}/chunk_XXXXXXX.npz: per frame and class, how much the explained "
                                  "output drops when the class is removed, whether the greedy action flips, and "
                                  "what the removal did: overlap with other boxes (kept), residue pixels left "
                                  "around the boxes (jaxsal.load_object_effects)")
        return d


def read_objects(path, game: str | None = None) -> ObjectsInput:
    """Read and check an objects file (format in the module doc); errors name the fix."""
    from jaxsal.game_objects import ObjectBoxes

    p = Path(path)
    if not p.exists():
        raise SaliencyInputError(f"objects file {p} does not exist; give --objects FILE ({FORMAT_HELP}), or "
                                 f"record frames with their boxes: {RECORD_HINT}")
    try:
        z = np.load(p, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # an .npy under an .npz name: one array, no members
            raise ValueError(f"a single {type(z).__name__}, not an archive of arrays")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:  # EOFError: empty; BadZipFile: cut off
        raise SaliencyInputError(f"objects file {p} is not a readable .npz ({brief(e)}); "
                                 f"expected {FORMAT_HELP}") from None
    with z:
        missing = [k for k in ("boxes", "labels", "classes") if k not in z.files]
        if missing:
            raise SaliencyInputError(f"objects file {p} has no {', '.join(missing)} (it holds "
                                     f"{', '.join(z.files) or 'nothing'}); expected {FORMAT_HELP}")
        from jaxsal.io.store import bytes_after, declared_past_member

        short = declared_past_member(z.zip, [k for k in ("boxes", "labels", "classes", "size", "game") if k in z.files])
        if short:  # before reading: numpy allocates what a header declares (29 TiB for a crafted one)
            raise SaliencyInputError(f"objects file {p} is corrupt ({short}); copy it again or record the boxes again: "
                                     f"{RECORD_HINT}")
        try:
            boxes, labels, classes = z["boxes"], z["labels"], z["classes"]
            size = z["size"] if "size" in z.files else np.asarray([84, 84])
            file_game = z["game"] if "game" in z.files else None
        except ValueError as e:  # object arrays need pickle, which we never load
            raise SaliencyInputError(f"objects file {p}: {str(e).splitlines()[0]}; store classes as a str "
                                     f"array (np.asarray(names)), not objects") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # a member's bytes damaged (CRC, deflate)
            raise SaliencyInputError(f"objects file {p} is corrupt ({str(e).splitlines()[0]}); copy it again or "
                                     f"record the boxes again: {RECORD_HINT}") from None
        arrays = {"boxes": boxes, "labels": labels, "classes": classes, "size": size}
        extra = bytes_after(z.zip, {k: a for k, a in arrays.items() if k in z.files})
        if extra:  # np.load reads the header's array and drops the rest: boxes of frames appended, silently
            raise SaliencyInputError(f"objects file {p} is corrupt ({extra}, past the shape its header declares); "
                                     f"copy it again or record the boxes again: {RECORD_HINT}")
    if size.shape != (2,) or not np.issubdtype(size.dtype, np.integer) or not ((size >= 1) & (size <= 4096)).all():
        raise SaliencyInputError(f"objects file {p}: size must be the frame's (height, width), 2 integers from 1 to "
                                 f"4096, got {size.dtype} {size.tolist() if size.size <= 4 else size.shape}")
    if file_game is not None:  # one name: str() of an array of names would be a name matching no agent
        if file_game.shape != () or file_game.dtype.kind != "U":  # bytes: str() gives "b'pong'"
            raise SaliencyInputError(f"objects file {p}: game must be one name (np.asarray('pong')), got "
                                     f"{file_game.dtype} {file_game.shape}")
        file_game = str(file_game)
    size = (int(size[0]), int(size[1]))
    if boxes.ndim != 4 or boxes.shape[-1] != 4 or labels.shape != boxes.shape[:3]:
        raise SaliencyInputError(f"objects file {p}: boxes must be (N, F, K, 4) and labels (N, F, K), got "
                                 f"{boxes.shape} and {labels.shape}")
    if classes.ndim != 1 or classes.dtype.kind != "U" or not 1 <= len(classes) <= 127:  # bytes were named "b'ball'"
        raise SaliencyInputError(f"objects file {p}: classes must be a 1-D str array of 1 to 127 names (labels are "
                                 f"stored as int8), got {classes.dtype} {classes.shape}"
                                 + ("; decode bytes names: np.asarray([n.decode() for n in names])"
                                    if classes.dtype.kind == "S" else ""))
    fault = next(((str(c), f) for c in classes if (f := name_fault(str(c)))), None)
    if fault is not None:  # shares are reported by class name, on one line: a name must be one, and printed
        raise SaliencyInputError(f"objects file {p}: class name {fault[0][:40]!r} {fault[1]}; give each class a name "
                                 "of printed characters on one line, e.g. \"ball\"")
    twice = next((str(c) for i, c in enumerate(classes) if c in classes[:i]), None)
    if twice is not None:  # shares are reported by class name: one name for two classes would merge them
        raise SaliencyInputError(f"objects file {p} names class {twice!r} twice; give each class one distinct name")
    if not np.issubdtype(boxes.dtype, np.integer) or not np.issubdtype(labels.dtype, np.integer):
        raise SaliencyInputError(f"objects file {p}: boxes and labels must be integer arrays, got "
                                 f"{boxes.dtype} and {labels.dtype}")
    if labels.size and (labels.max() >= len(classes) or labels.min() < -1):
        raise SaliencyInputError(f"objects file {p}: labels must be -1 (none) or 0..{len(classes) - 1} "
                                 f"(one per class name), found {int(labels.min())}..{int(labels.max())}")
    used = labels >= 0
    b = boxes[used]
    if b.size and (b[:, :2].min() < 0 or b[:, 2].max() > size[0] or b[:, 3].max() > size[1]
                   or (b[:, 2] < b[:, 0]).any() or (b[:, 3] < b[:, 1]).any()):
        raise SaliencyInputError(f"objects file {p}: boxes must be half-open (y0, x0, y1, x1) inside the "
                                 f"{size[0]}x{size[1]} frame with y0 <= y1 and x0 <= x1")
    if game and file_game and _norm(game) != _norm(file_game):
        raise SaliencyInputError(f"objects file {p} holds boxes of {file_game!r} but the agent plays {game!r}: "
                                 "give the boxes recorded with this buffer")
    ob = ObjectBoxes(boxes.astype(np.int16), labels.astype(np.int8), tuple(str(c) for c in classes), *size)
    return ObjectsInput(ob, str(p.absolute()), file_game or game, _fingerprint(p))


def _norm(game: str) -> str:
    return game.lower().replace("_", "").replace("-", "").replace(" ", "")


def find_objects(objects_arg: str, input_path, game: str | None) -> ObjectsInput:
    """The boxes of `--objects [FILE]`: FILE, or (no FILE) the file beside the input buffer."""
    if objects_arg != "auto":
        return read_objects(objects_arg, game)
    if input_path is None:
        raise SaliencyInputError(
            "--objects without FILE looks for the boxes beside the input file, and these frames have no file: "
            f"give --objects FILE, or record frames with their boxes: {RECORD_HINT}")
    path = beside(input_path)
    if path.exists():
        return read_objects(path, game)
    from jaxsal.game_objects import games

    if game and _norm(game) not in games():
        raise SaliencyInputError(
            f"no boxes for {input_path} ({path.name} not found) and game {game!r} has no object table "
            f"(games with one: {', '.join(games())}); give --objects FILE with your own boxes ({FORMAT_HELP})")
    raise SaliencyInputError(
        f"no boxes for {input_path}: {path} not found. A replay buffer has no RAM, so give --objects FILE "
        f"({FORMAT_HELP}) or record frames with their boxes: {RECORD_HINT}")


def check_aligned(objects: ObjectsInput, n: int, frame_shape_nhwc) -> None:
    """The boxes must describe exactly the job's frames: same count, frame size and stack depth."""
    ob, where = objects.boxes, objects.path or "the boxes"
    if len(ob) != n:
        raise SaliencyInputError(
            f"{where} has boxes for {len(ob)} states but the input has {n} frames: the objects file must hold "
            "one row per buffer frame, in the buffer's order (record them together, or slice both the same way)")
    h, w, f = (int(v) for v in frame_shape_nhwc[-3:])
    if (ob.height, ob.width) != (h, w):
        raise SaliencyInputError(f"{where} has boxes for {ob.height}x{ob.width} frames but the frames are {h}x{w}; "
                                 "boxes must be in the agent's (preprocessed) frame pixels")
    if ob.boxes.shape[1] != f:
        raise SaliencyInputError(
            f"{where} has boxes for {ob.boxes.shape[1]} stacked frame(s) per state but the frames stack {f}; "
            f"save (N, {f}, K, 4) boxes, one set per stacked frame (oldest first), e.g. np.repeat the newest "
            "frame's boxes if only those are known")


def chunk_shares(maps, boxes, rows: int | None = None) -> dict:
    """One chunk's maps (n, H, W) or per-frame (n, H, W, F) on device, boxes (ObjectBoxes of the
    first `rows` of those states, default all) -> the arrays stored per chunk (module doc) for
    those rows, as numpy. The boxes are padded to the maps' rows (a job pads every chunk to the
    same size), so the last, shorter chunk reuses the compiled programs."""
    from jaxsal.metrics import object_attribution, object_pointing
    from jaxsal.game_objects import ObjectBoxes

    rows = len(boxes) if rows is None else rows
    pad = maps.shape[0] - len(boxes)
    if pad > 0:
        boxes = ObjectBoxes.concatenate([boxes, boxes[np.full(pad, len(boxes) - 1)]])
    elif pad < 0:
        raise SaliencyInputError(f"{maps.shape[0]} maps but boxes for {len(boxes)} states")
    masks = boxes.masks()                                     # (n, F, C, H, W) bool, built once
    res = object_attribution(maps, masks, classes=boxes.classes)
    hits, _ = object_pointing(maps, masks, classes=boxes.classes)
    out = {"positive": res.positive, "absolute": res.absolute, "chance": res.chance, "present": res.present,
           "pointing": hits}
    if maps.ndim == 4:
        out.update(per_frame_positive=res.per_frame_positive, per_frame_absolute=res.per_frame_absolute,
                   per_frame_chance=res.per_frame_chance)
    else:
        per = [object_attribution(maps, masks, classes=boxes.classes, frame=f) for f in range(masks.shape[1])]
        for k in ("positive", "absolute", "chance"):
            out[f"per_frame_{k}"] = np.stack([np.asarray(getattr(r, k)) for r in per], 1)
    return {k: np.asarray(v, bool if k in ("present", "pointing") else np.float32)[:rows] for k, v in out.items()}


def write_shares(out, alias: str, index: int, shares: dict):
    """One chunk's object shares of one method, atomically (an .npz, no pickle)."""
    from jaxsal.io.store import atomic_write

    path = objects_path(out, alias, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.savez(f, **{k: np.ascontiguousarray(v) for k, v in shares.items()}))


def chunk_effects(apply_fn, params, x, boxes, rows: int, target: str, actions=None, layout: str = "NHWC",
                  batch_size: int | None = 256) -> dict:
    """One chunk's frames x (padded rows, on device, the model's layout), the ObjectBoxes of its first
    `rows` states -> the arrays stored per chunk with --effects (module doc), as numpy, for those rows.
    `actions`: the chunk's (padded) actions for target q_action, else None (the target's own choice,
    as the maps explain); `batch_size`: model rows per forward pass (None: the backend's default, as for
    the maps). The boxes are padded like `chunk_shares`'s."""
    from jaxsal import sizing
    from jaxsal.metrics.effects import object_effects
    from jaxsal.game_objects import ObjectBoxes

    pad = x.shape[0] - len(boxes)
    if pad > 0:
        boxes = ObjectBoxes.concatenate([boxes, boxes[np.full(pad, len(boxes) - 1)]])
    eff = object_effects(apply_fn, params, x, boxes, target=target, actions=actions, layout=layout,
                         batch_size=sizing.rows(batch_size), **EFFECTS_CONFIG)
    out = {"effect": (eff.effect, np.float32), "flips": (eff.flips, bool), "present": (eff.present, bool),
           "score": (eff.score, np.float32), "action": (eff.actions, np.int32),
           "overlap": (eff.overlap, np.float32), "residue": (eff.residue, np.int32),
           "residue_share": (eff.residue_share, np.float32)}
    return {k: np.asarray(v, t)[:rows] for k, (v, t) in out.items()}


def write_effects(out, index: int, effects: dict):
    """One chunk's object effects, atomically (an .npz, no pickle)."""
    from jaxsal.io.store import atomic_write

    path = effects_path(out, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.savez(f, **{k: np.ascontiguousarray(v) for k, v in effects.items()}))


def drop_temp_files(out, aliases):
    """Temp files a killed single-process run left in the shares (and effects) directories."""
    for a in list(aliases) + [EFFECTS]:
        d = Path(out) / OBJECTS / a
        for tmp in d.glob(".chunk_*.tmp") if d.exists() else ():
            tmp.unlink(missing_ok=True)


def _objects_config(out, cfg) -> dict:
    """The manifest's objects entry, checked: a hand-edited one is a clear error, not a TypeError."""
    from jaxsal.io.store import MANIFEST

    o = cfg.get("objects")
    if o is None:
        return o
    if not (isinstance(o, dict) and isinstance(o.get("classes"), list) and o["classes"]
            and all(isinstance(c, str) for c in o["classes"]) and type(o.get("frames")) is int and o["frames"] >= 1
            and isinstance(o.get("effects", {}), dict)):
        raise SaliencyInputError(f"{Path(out) / MANIFEST} is corrupt (its objects entry is not classes: names, "
                                 "frames >= 1, as `jaxsal explain --objects` writes); choose a new --out directory")
    return o


def _read_chunk(path: Path, rows: int, spec: dict, layout) -> dict:
    """The arrays of one shares or effects chunk, each checked against `spec` {key: (trailing shape,
    dtype kinds)}: a truncated, emptied or replaced file is a clear error naming the fix, never a
    zipfile/numpy traceback nor shares joined to the wrong frames or classes."""
    from jaxsal.io.store import _read_checked_npz

    def check(arrays):
        missing = [k for k in spec if k not in arrays]
        return f"no {', '.join(missing)}" if missing else next(
            (f"{k!r} has shape {v.shape} and dtype {v.dtype}, not {(rows,) + spec[k][0]} of {spec[k][1]}"
             for k, v in arrays.items() if v.shape != (rows,) + spec[k][0] or v.dtype.kind not in spec[k][1]), None)

    return _read_checked_npz(path, check, keys=tuple(spec), layout=layout + (rows,))


def _chunks_done(out, cfg, paths, what: str, allow_incomplete: bool) -> list[int]:
    """The chunks with every file of `paths` (chunk index -> path) written, refused if incomplete unless allowed."""
    from jaxsal.io.store import finished_chunks

    return finished_chunks(out, paths, -(-int(cfg["n"]) // int(cfg["chunk"])), what, allow_incomplete)


def load_object_effects(out, allow_incomplete: bool = False) -> dict:
    """Per-frame object effects of a `jaxsal explain --objects --effects` output directory: what
    the agent's output did when each object class was removed.

    Args:
        out (str | os.PathLike): the output directory.
        allow_incomplete (bool): give the frames of the chunks finished so far (in order; "frame"
            says which) instead of refusing an unfinished job.

    Returns:
        dict: "classes" (the C class names), "frame" (N,), "effect" (N, C) float32 (how much the
            explained output drops when the class is removed), "flips" (N, C) bool (the greedy
            action changes), "present" (N, C) bool, "score" (N,) float32, "action" (N,) int32, and
            what each removal did: "overlap" (N, C) float32, "residue" (N, C) int32,
            "residue_share" (N, C) float32 (meanings in `jaxsal.metrics.object_effects`; a job
            written before these existed has no such keys).

    Raises:
        jaxsal.SaliencyInputError: `out` is no jaxsal output directory, its input failed to
            read, it has no object effects, or the job is incomplete (without
            `allow_incomplete`).
    """
    from jaxsal.io.store import check_input_ok, read_manifest

    check_input_ok(out)
    cfg = read_manifest(out)["config"]
    if "effects" not in (_objects_config(out, cfg) or {}):
        raise SaliencyInputError(f"{out} has no object effects: rerun `jaxsal explain` with --objects --effects "
                                 "into a new --out")
    return _read_effects(out, cfg, _chunks_done(out, cfg, [lambda i: effects_path(out, i)], "object effects",
                                                allow_incomplete))


def _read_effects(out, cfg, done) -> dict:
    """`load_object_effects`'s dict from the effects files of chunks `done`."""
    n, chunk = int(cfg["n"]), int(cfg["chunk"])
    classes = tuple(cfg["objects"]["classes"])
    c = len(classes)
    removal_fields = "frames" in cfg["objects"]["effects"]     # jobs before frames= stored no removal fields
    kinds = {"effect": "f", "flips": "b", "present": "b", "score": "f", "action": "iu", "overlap": "f",
             "residue": "iu", "residue_share": "f"}
    spec = {k: ((c,) if k not in ("score", "action") else (), kinds[k]) for k in EFFECT_KEYS
            if k not in REMOVAL_KEYS or removal_fields}
    parts: dict = {k: [] for k in ("frame",) + EFFECT_KEYS}
    for i in done:
        for k, v in _read_chunk(effects_path(out, i), min(n, (i + 1) * chunk) - i * chunk, spec, (out, n, chunk)).items():
            parts[k].append(v)
        parts["frame"].append(np.arange(i * chunk, min(n, (i + 1) * chunk)))
    empty = {"frame": ((0,), np.int64), "effect": ((0, c), np.float32), "flips": ((0, c), bool),
             "present": ((0, c), bool), "score": ((0,), np.float32), "action": ((0,), np.int32),
             "overlap": ((0, c), np.float32), "residue": ((0, c), np.int32), "residue_share": ((0, c), np.float32)}
    res = {k: np.concatenate(parts[k]) if parts[k] else np.zeros(*empty[k]) for k in empty
           if k not in REMOVAL_KEYS or removal_fields}
    res["classes"] = classes
    return res


def load_object_shares(out, method: str, allow_incomplete: bool = False, effects: bool = False) -> dict:
    """Per-frame object shares of `method` in a `jaxsal explain --objects` output directory: how
    much of each map fell on each game object class.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias in the job.
        allow_incomplete (bool): give the frames of the chunks finished so far (in order; "frame"
            says which) instead of refusing an unfinished job.
        effects (bool): also the object effects of a job run with `--effects`, for the same
            frames (with `allow_incomplete`: the chunks that have both).

    Returns:
        dict: "classes" (the C class names; column c is class `classes[c]`), "frame" (N,),
            "positive"/"absolute"/"chance" (N, C) float32, "present"/"pointing" (N, C) bool,
            "per_frame_positive"/"per_frame_absolute"/"per_frame_chance" (N, F, C) (meanings in
            `jaxsal.metrics.object_attribution`); with `effects=True` also "effect", "flips"
            (N, C), "score", "action" (N,) and "overlap", "residue", "residue_share" (N, C), as
            `load_object_effects` gives them.

    Raises:
        jaxsal.SaliencyInputError: `out` is no jaxsal output directory, its input failed to
            read, it has no object shares (or no effects, with `effects=True`) or none of
            `method`, or the job is incomplete (without `allow_incomplete`).
    """
    from jaxsal.io.store import check_input_ok, read_manifest

    check_input_ok(out)
    cfg = read_manifest(out)["config"]
    _objects_config(out, cfg)
    if effects and "objects" in cfg and "effects" not in cfg["objects"]:
        raise SaliencyInputError(f"{out} has no object effects: rerun `jaxsal explain` with --objects --effects "
                                 "into a new --out (or load the shares without effects=True)")
    if "objects" not in cfg:
        raise SaliencyInputError(f"{out} has no object shares: rerun `jaxsal explain` with --objects into a new --out")
    if method not in cfg["methods"]:
        raise SaliencyInputError(f"{out} has no object shares for method {method!r}; it holds "
                                 f"{', '.join(cfg['methods'])}")
    n, chunk = int(cfg["n"]), int(cfg["chunk"])
    done = _chunks_done(out, cfg, [lambda i: objects_path(out, method, i)] + ([lambda i: effects_path(out, i)]
                                                                                if effects else []),
                        f"{method!r} shares" + (" or effects" if effects else ""), allow_incomplete)
    classes = tuple(cfg["objects"]["classes"])
    c, f = len(classes), cfg["objects"]["frames"]
    spec = {k: ((f, c) if k.startswith("per_frame") else (c,), "b" if k in ("present", "pointing") else "f")
            for k in SHARE_KEYS}
    parts: dict = {"frame": []}
    for i in done:
        for k, v in _read_chunk(objects_path(out, method, i), min(n, (i + 1) * chunk) - i * chunk, spec,
                                 (out, n, chunk)).items():
            parts.setdefault(k, []).append(v)
        parts["frame"].append(np.arange(i * chunk, min(n, (i + 1) * chunk)))
    empty = {"frame": (0,), **{k: (0, f, c) if k.startswith("per_frame") else (0, c) for k in SHARE_KEYS}}
    res = {k: (np.concatenate(parts[k]) if parts.get(k) else
               np.zeros(empty[k], bool if k in ("present", "pointing") else np.int64 if k == "frame" else np.float32))
           for k in empty}
    res["classes"] = classes
    if effects:
        eff = _read_effects(out, cfg, done)
        res.update({k: eff[k] for k in ("effect", "flips", "score", "action") + REMOVAL_KEYS if k in eff})
    return res


def mean_shares(shares: dict) -> dict:
    """{class: {"positive", "absolute", "chance", "pointing", "states"}}: means over the frames that show
    the class (and whose map has mass), from `load_object_shares`'s dict."""
    out = {}
    for i, c in enumerate(shares["classes"]):
        here = shares["present"][:, i]
        row = {}
        for k in ("positive", "absolute", "chance", "pointing"):
            v = np.asarray(shares[k][here, i], np.float64)
            row[k] = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
        row["states"] = int(here.sum())
        out[c] = row
    return out


def summary_lines(out, methods, effects: bool = False) -> list[str]:
    """A few lines for the end of a job: each method's mean positive share per class vs chance (and with
    `effects`, each class's mean effect and how often removing it flips the action)."""
    lines = ["object shares (positive mass on the class, mean over frames showing it; chance = area share):"]
    for m in methods:
        try:
            table = mean_shares(load_object_shares(out, m, allow_incomplete=True))
        except SaliencyInputError:
            continue
        cells = ", ".join(f"{c} {r['positive']:.2f} (chance {r['chance']:.2f})" for c, r in table.items()
                          if r["states"])
        lines.append(f"  {m}: {cells or 'no class on screen'}")
    if effects:
        try:
            e = load_object_effects(out, allow_incomplete=True)
        except SaliencyInputError:
            return lines
        cells = [f"{c} {e['effect'][e['present'][:, j], j].mean():.3g} (flips {e['flips'][e['present'][:, j], j].mean():.0%})"
                 for j, c in enumerate(e["classes"]) if e["present"][:, j].any()]
        lines.append("object effects (drop of the explained output when the class is removed, mean over frames "
                     f"showing it; how often the greedy action flips): {', '.join(cells) or 'no class on screen'}")
        if "overlap" in e:
            cells = [f"{c} overlap {np.nanmean(e['overlap'][e['present'][:, j], j]):.0%}, residue in "
                     f"{(e['residue'][e['present'][:, j], j] > 0).mean():.0%} of frames"
                     for j, c in enumerate(e["classes"]) if e["present"][:, j].any()]
            lines.append("what the removals did (share of the class's box pixels inside other boxes, kept; frames "
                         f"with non-background pixels left around its boxes): {', '.join(cells)}")
    return lines


def write_meta(out, objects: ObjectsInput, store_maps: bool):
    """DIR/_objects/meta.json: where the boxes came from and what each stored array means."""
    from jaxsal.io.store import atomic_write

    d = Path(out) / OBJECTS
    d.mkdir(parents=True, exist_ok=True)
    meta = {**objects.describe(), "maps_stored": store_maps, "keys": list(SHARE_KEYS),
            **({"effect_keys": list(EFFECT_KEYS)} if objects.effects else {}),
            "doc": "see the docstring of jaxsal.io.object_files; load with jaxsal.load_object_shares(DIR, METHOD)"}
    data = json.dumps(meta, indent=2, sort_keys=True).encode()
    if not ((d / "meta.json").exists() and (d / "meta.json").read_bytes() == data):  # a rerun: read-only ok
        atomic_write(d / "meta.json", data)


EFFECTS_NEED_OBJECTS = "--effects removes the objects of the boxes that --objects reads: add --objects [FILE]"


def for_job(objects_arg, store: str, input_path, game, n_frames: int, frame_shape_nhwc, limit=None,
            effects: bool = False):
    """`jaxsal explain`'s --objects [FILE], --store maps|shares and --effects -> (ObjectsInput or None,
    store_maps). The boxes are checked against the whole input, then cut to `--limit` like the frames."""
    if store not in ("maps", "shares"):
        raise SaliencyInputError(f"--store must be maps or shares, got {store!r}")
    if objects_arg is None:
        if store == "shares":
            raise SaliencyInputError("--store shares keeps only the object shares: add --objects [FILE]")
        if effects:
            raise SaliencyInputError(EFFECTS_NEED_OBJECTS)
        return None, True
    objects = dataclasses.replace(find_objects(objects_arg, input_path, game), effects=bool(effects))
    check_aligned(objects, n_frames, frame_shape_nhwc)
    if limit is not None and limit < n_frames:
        objects = objects.limited(limit)
    return objects, store == "maps"
