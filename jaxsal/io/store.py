"""On-disk chunked map store: one directory per method, one .npy per chunk, a JSON manifest.

Each chunk is written to a temporary name, flushed and renamed, so a chunk file either
exists complete or not at all; a job killed at any moment resumes by computing only the
missing chunks. The manifest records what produced the maps (method, options, agent,
params checksum, input checksum, version, time); a rerun with a different configuration
into the same directory is refused instead of mixing results.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from jaxsal.caching import LRU
from jaxsal.errors import SaliencyInputError, brief

MANIFEST = "manifest.json"
OUTPUTS = "_outputs"  # per chunk: explained action and model outputs
FORMAT = 1


INPUT_FAILED = "_input_failed.json"  # the job's input failed to read after chunks were written


class JobConfigError(SaliencyInputError):
    """The output directory holds results of a different job."""


def mark_input_failed(out, error: str) -> None:
    """Record that the job's input failed to read (corrupt or truncated) while the job ran.

    The chunks written before may hold maps of corrupt frames, so nothing in `out` is served or
    resumed afterwards (`check_input_ok` refuses it). Best effort: an OSError while recording
    is swallowed, since the input's error is what is reported.

    Args:
        out (str | os.PathLike): the job's output directory.
        error (str): the input's error message, kept in the record.
    """
    try:
        if Path(out).is_dir():
            atomic_write(Path(out) / INPUT_FAILED, json.dumps({"error": error, "time": stamp()}).encode())
    except OSError:
        pass  # best effort (e.g. a full disk): the input's error is what is reported


def check_input_ok(out) -> None:
    """Refuse an output directory whose input failed to read while its job ran.

    Args:
        out (str | os.PathLike): a `jaxsal explain` output directory.

    Raises:
        jaxsal.SaliencyInputError: `out` holds a `mark_input_failed` record.
    """
    path = Path(out) / INPUT_FAILED
    if not path.exists():
        return
    try:
        why = str(json.loads(path.read_text()).get("error", ""))[:300]
    except (OSError, ValueError, AttributeError):
        why = "unreadable record"
    raise SaliencyInputError(f"{out}: its input failed to read while the job ran ({why}), so its chunks may hold "
                             f"maps of corrupt frames and are not used: remove {out} (or choose a new --out) "
                             "and explain an intact copy of the input")


def _mount_point(path: Path) -> Path:
    path = path.absolute()
    while not os.path.ismount(path) and path.parent != path:
        path = path.parent
    return path


def disk_full(path: Path) -> OSError:
    """The ENOSPC error to raise for a full disk: it names the disk's mount point, its free space
    and the folder being written.

    Args:
        path (pathlib.Path): the file whose write failed.

    Returns:
        OSError: errno ENOSPC, with the message and folder set.
    """
    folder = Path(path).absolute().parent
    try:
        import shutil

        free = f", {shutil.disk_usage(folder).free / 2**20:.1f} MiB free"
    except OSError:
        free = ""
    return OSError(errno.ENOSPC, f"no space left on the disk mounted at {_mount_point(folder)}{free}", str(folder))


def atomic_write(path: Path, data) -> None:
    """Write a file so that it exists complete or not at all: a temp file, fsync, then rename.

    Args:
        path (pathlib.Path): the file to write (replaced if it exists).
        data (bytes | Callable): the bytes, or a function `data(file)` writing to the open file.

    Raises:
        OSError: the write failed (IsADirectoryError naming `path` when a directory is there); a full
            disk (or numpy's short "N requested and M written") is reported as ENOSPC by `disk_full`.
            The temp file is removed either way.
    """
    if Path(path).is_dir():  # else os.replace's error names the temp file, not this path
        raise IsADirectoryError(errno.EISDIR, "a directory is where this file is to be written; move it away",
                                str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.errno == errno.ENOSPC or (e.errno is None and " requested and " in str(e)):
            raise disk_full(path) from None
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def chunk_path(out: Path, method: str, index: int) -> Path:
    """Where chunk `index` of a method's maps lives: `out/<method>/chunk_XXXXXXX.npy`.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias in the job (its folder name).
        index (int): the chunk's index.

    Returns:
        pathlib.Path: the chunk file's path (it may not exist yet).
    """
    return Path(out) / method / f"chunk_{index:07d}.npy"


def write_chunk(out: Path, method: str, index: int, maps: np.ndarray) -> None:
    """Write one chunk of maps atomically (temp file, fsync, rename), as a plain `.npy`.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias (its folder is created if missing).
        index (int): the chunk's index.
        maps (numpy.ndarray): the chunk's maps, (rows, H, W) or (rows, H, W, C).

    Raises:
        OSError: the write failed (ENOSPC for a full disk).
    """
    path = chunk_path(out, method, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.save(f, np.ascontiguousarray(maps), allow_pickle=False))


def outputs_path(out: Path, index: int) -> Path:
    """Where chunk `index`'s explained actions and model outputs live: `out/_outputs/chunk_*.npz`.

    Args:
        out (str | os.PathLike): the output directory.
        index (int): the chunk's index.

    Returns:
        pathlib.Path: the outputs file's path (it may not exist yet).
    """
    return Path(out) / OUTPUTS / f"chunk_{index:07d}.npz"


def outputs_done(out: Path, index: int) -> bool:
    """Whether chunk `index`'s outputs file is complete: it exists and has each state's input index.

    Older jaxsal versions wrote no index: a rerun of the job rewrites those files, recomputing
    only the model outputs.

    Args:
        out (str | os.PathLike): the output directory.
        index (int): the chunk's index.

    Returns:
        bool: True when the file exists, is a readable zip and holds "index.npy".
    """
    path = outputs_path(out, index)
    if not path.exists():
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return "index.npy" in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def write_outputs(out: Path, index: int, outputs: dict) -> None:
    """Write one chunk's explained actions and model outputs atomically (an `.npz`, no pickle).

    The same arrays give the same bytes (every member has a fixed timestamp), so a resumed job's
    files equal a fresh run's.

    Args:
        out (str | os.PathLike): the output directory.
        index (int): the chunk's index.
        outputs (dict[str, numpy.ndarray]): the chunk's arrays by name ("index", "action",
            "q", ...).

    Raises:
        OSError: the write failed (ENOSPC for a full disk).
    """
    path = outputs_path(out, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: _write_npz(f, outputs))


def _write_npz(f, arrays: dict):
    """An .npz that np.load reads, with a fixed timestamp on every member: the same arrays give the
    same bytes (np.savez stamps the wall clock, so a resumed job's files would differ from a fresh
    run's only in their dates)."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for k, v in arrays.items():
            with z.open(zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w", force_zip64=True) as m:
                np.lib.format.write_array(m, np.ascontiguousarray(v), allow_pickle=False)


def load_outputs(out, allow_incomplete: bool = False) -> dict:
    """What each frame of a `jaxsal explain` output directory explained: its action and the
    model's outputs, to join the maps with.

    Args:
        out (str | os.PathLike): the output directory.
        allow_incomplete (bool): give the frames of the chunks finished so far (in order) instead
            of refusing an unfinished job.

    Returns:
        dict[str, numpy.ndarray]: "frame" (N,) the row of the maps; "index" (N,) the state's
            index in the input (its row number; for a Dopamine replay directory the buffer
            index, with "checkpoint" (N,) its checkpoint, so maps join with the buffer's actions
            and rewards); "action" (N,) (absent for a target that explains no action, e.g.
            target="value"); "q" (N, A) for Q-networks or "logits" (N, A) for policies; "value"
            (N,) when the model has one.

    Raises:
        jaxsal.SaliencyInputError: `out` is no jaxsal output directory, its input failed to
            read, the job is incomplete (without `allow_incomplete`), or its chunks were written
            by jaxsal versions that stored different outputs.
    """
    from jaxsal.targets import TARGET_NAMES, explains_action

    check_input_ok(out)
    cfg = read_manifest(out)["config"]
    no_action = cfg.get("target") in TARGET_NAMES and not explains_action(cfg["target"])
    n, chunk = int(cfg["n"]), int(cfg["chunk"])
    done = finished_chunks(out, [lambda i: outputs_path(out, i)], -(-n // chunk), None, allow_incomplete)
    parts: dict[str, list] = {"frame": []}
    keys = None
    for i in done:
        z = _read_outputs(outputs_path(out, i), min(n, (i + 1) * chunk) - i * chunk, (out, n, chunk))
        if keys is not None and set(z) != keys:  # never concatenate misaligned columns
            raise SaliencyInputError(
                f"{outputs_path(out, i)} holds {sorted(z)} but earlier chunks hold {sorted(keys)} "
                "(chunks of different jaxsal versions); rerun the same `jaxsal explain` command, which "
                "rewrites the older chunks' outputs")
        keys = set(z)
        for k, v in z.items():
            if not (no_action and k == "action"):
                parts.setdefault(k, []).append(v)
        parts["frame"].append(np.arange(i * chunk, min(n, (i + 1) * chunk)))
    return {k: (np.concatenate(v) if v else np.zeros((0,), np.int64)) for k, v in parts.items()}


def _read_outputs(path: Path, rows: int, layout) -> dict:
    """The arrays of one chunk's outputs file, each checked to hold one entry per frame of the chunk."""
    def check(arrays):
        short = next((f"{k!r} has shape {v.shape}, not {rows} rows" for k, v in arrays.items()
                      if v.ndim == 0 or v.shape[0] != rows), None)
        a = arrays.get("action")
        if short is not None or a is None:
            return short
        # an action is a column of the model's output vector: one outside it (edited, or another job's file) was
        # an IndexError in render's captions, or, negative, captioned with another action's Q-value
        if not np.issubdtype(a.dtype, np.integer):
            return f"'action' has dtype {a.dtype}, not integers"
        width = max((v.shape[-1] for k, v in arrays.items() if k in ("q", "logits") and v.ndim == 2), default=None)
        if a.size and (int(a.min()) < 0 or (width is not None and int(a.max()) >= width)):
            return (f"'action' holds {int(a.min()) if int(a.min()) < 0 else int(a.max())}, not one of the "
                    f"{width} actions of its outputs" if width is not None else "'action' holds a negative action")
        return None

    return _read_checked_npz(path, check, layout=layout + (rows,))


def check_short_chunk(path: Path, out, n: int, chunk: int, held: set, rows: int) -> None:
    """A chunk holding fewer rows than a full chunk where the manifest's n puts a full one: only a job's last chunk
    is short, so its n (with each meta.json) was edited, or the file replaced; the error names both fixes.

    Args:
        path (pathlib.Path): the chunk file.
        out (str | os.PathLike): the output directory.
        n (int): the manifest's number of frames.
        chunk (int): the manifest's chunk size.
        held (set[int]): the first sizes of the file's arrays.
        rows (int): the rows n puts in this chunk.

    Raises:
        jaxsal.SaliencyInputError: the file holds one number of rows, fewer than a full chunk that n puts there.
    """
    if len(held) == 1 and 0 < min(held) < rows == chunk:
        raise SaliencyInputError(
            f"{path} holds {min(held)} rows, as only a job's last chunk does, but {Path(out) / MANIFEST} says n is {n} "
            f"(so {rows} there): restore the manifest's n and each meta.json if they were edited, else delete the "
            "chunk and rerun the same `jaxsal explain` command")


def bytes_after(zf: zipfile.ZipFile, arrays: dict) -> str | None:
    """What is wrong when a member holds bytes past the array its header declares (np.load ignores them).

    Args:
        zf (zipfile.ZipFile): the open .npz archive.
        arrays (dict): the arrays read from it, by member name without ".npy".

    Returns:
        str | None: "N bytes after array 'k'" for the first such member, else None.
    """
    from jaxsal.io.readers import _npy_header

    for k, a in arrays.items():
        with zf.open(f"{k}.npy") as f:
            extra = zf.getinfo(f"{k}.npy").file_size - _npy_header(f, k)[2] - a.nbytes
        if extra > 0:
            return f"{extra} bytes after array {k!r}"
    return None


def declared_past_member(zf: zipfile.ZipFile, keys) -> str | None:
    """What is wrong when a member's .npy header is unreadable or declares more than the member holds.

    A negative shape or more bytes than the member holds mark a cut-off or crafted file. Checked before
    reading: numpy allocates what a header declares (terabytes for a crafted one). Object arrays pass:
    reading them is refused with its own fix.

    Args:
        zf (zipfile.ZipFile): the open .npz archive.
        keys (Iterable[str]): the members to check, by name without ".npy".

    Returns:
        str | None: what is wrong with the first such member, else None.
    """
    import math

    from jaxsal.io.readers import read_npy_header

    for k in keys:
        info = zf.getinfo(f"{k}.npy")
        try:
            with zf.open(info) as f:
                shape, _, dtype = read_npy_header(f)
                held = info.file_size - f.tell()
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            return f"the header of array {k!r} cannot be read: {brief(e)}"
        if any(d < 0 for d in shape):
            return f"the header of array {k!r} declares the negative shape {tuple(shape)}"
        if not dtype.hasobject and math.prod(shape) * dtype.itemsize > held:
            return (f"the header of array {k!r} declares {tuple(shape)} {dtype}, {math.prod(shape) * dtype.itemsize} "
                    f"bytes, but the file holds {held}")
    return None


def _read_checked_npz(path: Path, check, keys=None, layout=None) -> dict:
    """The arrays of one result chunk (.npz; only `keys` where given) and `check(arrays)`, which says what is
    wrong or None: a truncated, emptied or replaced file is a clear error naming the fix, never a zipfile or
    numpy traceback nor results joined to the wrong frames. `layout` (out, n, chunk, rows) names an edited n."""
    try:
        with np.load(path, allow_pickle=False) as z:
            present = [k for k in (z.files if keys is None else keys) if k in z.files]
            why = declared_past_member(z.zip, present)
            arrays = {} if why else {k: z[k] for k in present}
            why = why or bytes_after(z.zip, arrays) or check(arrays)
    except (zipfile.BadZipFile, ValueError, EOFError, zlib.error, IsADirectoryError) as e:
        why, arrays = brief(e), {}
    if why is not None and layout is not None and arrays:
        out, n, chunk, rows = layout
        check_short_chunk(path, out, n, chunk, {v.shape[0] for v in arrays.values() if v.ndim}, rows)
    if why is not None:
        raise SaliencyInputError(f"{path} is corrupt ({why}): delete it and rerun the same `jaxsal explain` "
                                 "command, which computes that chunk again")
    return arrays


def check_frames_held(out, n: int, holds: int, where) -> None:
    """The manifest's n against the frames its input holds (more for a --limit job): an n edited by hand (with
    each meta.json, so they agree) is refused before arrays or loops of n entries (10^15: 909 TiB of flags).

    Args:
        out (str | os.PathLike): the job's output directory (named in the error).
        n (int): the manifest's number of frames.
        holds (int): the frames the job's input holds.
        where (str | None): the input's path, named in the error.

    Raises:
        jaxsal.SaliencyInputError: n is more than `holds`, the frames of the input `where`.
    """
    if n > holds:
        raise SaliencyInputError(f"{Path(out) / MANIFEST} is corrupt: its n is {n} but its input {where} holds {holds} "
                                 f"frames (the manifest was edited); restore its n (and each method's meta.json) or "
                                 "choose a new --out directory")


def finished_frames(out, methods) -> np.ndarray:
    """Which frames are finished for every method: what a partial `load_maps` holds.

    Args:
        out (str | os.PathLike): the output directory.
        methods (Sequence[str]): method aliases in the job.

    Returns:
        numpy.ndarray: bool (N,), True for the frames whose chunk exists for every method.

    Raises:
        jaxsal.SaliencyInputError: `out` is no jaxsal output directory, or its input failed to read.
    """
    check_input_ok(out)
    cfg = read_manifest(out)["config"]
    n, chunk = int(cfg["n"]), int(cfg["chunk"])
    try:
        ok = np.zeros(n, bool)
    except MemoryError:
        raise SaliencyInputError(f"{Path(out) / MANIFEST} says the job has {n} frames, more than memory can flag "
                                 "(was it edited?); restore its n (and each method's meta.json)") from None
    if not methods:  # every frame is finished for no method
        ok[:] = True
        return ok
    for i in finished_chunks(out, [lambda i, m=m: chunk_path(out, m, i) for m in methods], -(-n // chunk), None, True):
        ok[i * chunk:(i + 1) * chunk] = True
    return ok


def _make_out(out: Path) -> None:
    """The output directory, created where missing; a path through a file is one clear error."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SaliencyInputError(f"output {out} exists and is not a directory") from None
    except NotADirectoryError:
        raise SaliencyInputError(f"cannot create output {out}: part of its path is a file") from None


class JobBusyError(SaliencyInputError):
    """Another job is writing the same output directory now."""


@contextlib.contextmanager
def job_lock(out, shared: bool = False):
    """Hold the output directory for one job while it writes, so that a second job on it is refused.

    An advisory lock on the directory, released when the job ends or its process dies (a killed job
    resumes as before). A second job there while the first runs would compute the same chunks again
    and delete the first's temporary files. The processes of one multi-process job (each writing its
    own chunks) hold it together (`shared`).

    Args:
        out (str | os.PathLike): the job's output directory (created if missing).
        shared (bool): take the lock shared (a multi-process job) instead of exclusive.

    Returns:
        contextlib.AbstractContextManager: held while the `with` block runs.

    Raises:
        jaxsal.io.store.JobBusyError: another job holds the directory.
    """
    out = Path(out)
    _make_out(out)
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JobBusyError(f"another jaxsal job is writing {out} now: wait for it to end (or stop it) and rerun "
                           "the same command to resume, or choose another --out") from None
    except OSError:  # a filesystem without locks (ENOLCK on some network mounts): the job runs unguarded
        pass
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


def open_job(out, config: dict, meta: dict) -> dict:
    """Create the output directory and its manifest, or check an existing one was made by the
    same job (so a rerun resumes and never mixes results of two configurations).

    Safe for several processes starting at once: the first to link its manifest wins, the
    others compare against it. A directory whose earlier job wrote no chunk (e.g. it failed on a
    bad option) gets the new manifest.

    Args:
        out (str | os.PathLike): the output directory (created if missing).
        config (dict): everything that determines the maps (compared on rerun), JSON-able.
        meta (dict): provenance only (time, version), not compared.

    Returns:
        dict: the manifest, {"format", "config", **meta}.

    Raises:
        jaxsal.SaliencyInputError: `out` is a file or under one, or its input failed to read.
        jaxsal.io.store.JobConfigError: `out` is not empty and has no manifest, or holds results
            of a different job (another input, method, option, ...): the message names the
            differences.
    """
    out = Path(out)
    check_input_ok(out)
    _make_out(out)
    path = out / MANIFEST
    if not path.exists():
        if any(p.name != "input" for p in out.iterdir()):  # input/: a saved --play rollout
            raise JobConfigError(f"output directory {out} is not empty and has no {MANIFEST}; "
                                 "choose a new --out directory")
        manifest = {"format": FORMAT, "config": config, **meta}
        tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if another process got there first
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    manifest = read_manifest(out)
    old = manifest["config"]
    if old != json.loads(json.dumps(config)) and not _any_chunk(out):
        # the earlier job produced nothing (e.g. it failed on a bad option): replace it
        for d in out.iterdir():
            if d.is_dir() and (d / "meta.json").exists():
                (d / "meta.json").unlink()
        manifest = {"format": FORMAT, "config": config, **meta}
        atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode())
        return read_manifest(out)
    if old != json.loads(json.dumps(config)):
        diff = sorted(k for k in set(old) | set(config) if old.get(k) != json.loads(json.dumps(config.get(k))))
        details = "; ".join(f"{k}: was {old.get(k)!r}, now {config.get(k)!r}" for k in diff[:4])
        if "input" in diff:  # e.g. a corrupt input replaced since: resuming is not the fix
            raise JobConfigError(
                f"output directory {out} holds maps of another input ({details}): choose a new --out "
                f"directory, or remove {out} to explain this input there")
        raise JobConfigError(
            f"output directory {out} holds results of a different job ({details}); rerun with "
            "the same command to resume, or choose a new --out directory")
    return manifest


def _any_chunk(out: Path) -> bool:
    """Whether a job wrote any result: maps, outputs, or (--store shares) object shares or effects."""
    return any(next(out.glob(g), None) is not None
               for g in ("*/chunk_*.npy", f"{OUTPUTS}/chunk_*.npz", "_objects/*/chunk_*.npz"))


def read_manifest(out) -> dict:
    """The manifest of an output directory: what produced its maps.

    Args:
        out (str | os.PathLike): the output directory.

    Returns:
        dict: {"format", "config": {method, options, agent, params checksum, input, ...},
            "version", "created", ...}.

    Raises:
        jaxsal.SaliencyInputError: `out` has no manifest, or it is not valid JSON or not a job's.
    """
    path = Path(out) / MANIFEST
    if not path.exists():
        raise SaliencyInputError(f"{out} is not a jaxsal output directory (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, IsADirectoryError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise SaliencyInputError(f"{path} is corrupt ({brief(e)}); choose a "
                                 "new --out directory") from None
    cfg = manifest.get("config") if isinstance(manifest, dict) else None
    if not (isinstance(cfg, dict) and isinstance(cfg.get("methods"), dict)
            and type(cfg.get("chunk")) is int and cfg["chunk"] >= 1 and type(cfg.get("n")) is int and cfg["n"] >= 0):
        raise SaliencyInputError(f"{path} is corrupt (no config with methods, chunk >= 1 and n >= 0, as "
                                 "`jaxsal explain` writes); choose a new --out directory")
    _check_fields(path, manifest)
    _check_layout(Path(out), cfg)
    return manifest


def _is_source(v) -> bool:
    return isinstance(v, dict) and isinstance(v.get("path"), (str, type(None)))


FIELDS = {  # (in config?, field) -> (what `run_job` writes there, when it is of that kind)
    (False, "input_source"): ("an object with a path", _is_source),
    (False, "objects_source"): ("an object with a path", _is_source),
    (True, "input"): ("an object with a checksum string or a play entry",
                      lambda v: isinstance(v, dict) and (isinstance(v.get("checksum"), str) or "play" in v)),
    (True, "frame_shape"): ("a list of 3 sizes >= 1", lambda v: isinstance(v, list) and len(v) == 3
                            and all(type(d) is int and d >= 1 for d in v)),
    (True, "objects"): ("an object with a checksum string",
                        lambda v: isinstance(v, dict) and isinstance(v.get("checksum"), str)),
}


def _check_fields(path: Path, manifest: dict) -> None:
    """The fields render and a resume read, where present, of the kind `run_job` writes: one edited by hand is
    named here (else an AttributeError or KeyError inside render, or a resume that keeps it)."""
    for (in_config, key), (want, ok) in FIELDS.items():
        where = manifest["config"] if in_config else manifest
        if key in where and not ok(where[key]):
            got = json.dumps(where[key])
            got = got if len(got) <= 80 else got[:60] + "..."
            raise SaliencyInputError(f"{path} is corrupt (its {key} is {got}, not {want}, as `jaxsal explain` "
                                     "writes); choose a new --out directory")


def _check_layout(out: Path, cfg: dict) -> None:
    """The manifest's n and chunk against each method's meta.json, written with them and never changed: one
    edited by hand is named as such (else every chunk would be blamed for the rows it holds)."""
    for alias in cfg["methods"]:
        try:
            meta = json.loads((out / alias / "meta.json").read_text())
        except (OSError, ValueError):
            continue  # none yet (or unreadable): nothing to compare
        if not isinstance(meta, dict):
            continue
        for key in ("n", "chunk"):
            if key in meta and meta[key] != cfg[key]:
                raise SaliencyInputError(
                    f"{out / MANIFEST} is corrupt: its {key} is {cfg[key]!r} but {out / alias / 'meta.json'}, written "
                    f"with it, says {meta[key]!r} (the manifest was edited); restore {key} {meta[key]!r} or choose "
                    "a new --out directory")


def update_manifest(out, **fields) -> None:
    """Merge provenance fields (e.g. a summary) into the manifest, atomically.

    Args:
        out (str | os.PathLike): the output directory.
        **fields (Any): top-level manifest entries to set (JSON-able).

    Raises:
        jaxsal.SaliencyInputError: `out` has no readable manifest.
    """
    manifest = read_manifest(out)
    manifest.update(fields)
    atomic_write(Path(out) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())


def write_method_meta(out, alias: str, manifest: dict) -> None:
    """Write `out/<alias>/meta.json` (method, options, agent, checksums, version, time of this map
    array) once; an existing file is kept.

    Args:
        out (str | os.PathLike): the output directory.
        alias (str): the method's alias in the job (its folder name).
        manifest (dict): the job's manifest, as `open_job` returns it.
    """
    d = Path(out) / alias
    d.mkdir(parents=True, exist_ok=True)
    if (d / "meta.json").exists():
        return
    cfg = manifest["config"]
    meta = {"name": alias, **cfg["methods"][alias], "target": cfg["target"], "agent": cfg["agent"],
            "params_checksum": cfg["params_checksum"], "input": cfg["input"], "n": cfg["n"],
            "chunk": cfg["chunk"], "dtype": cfg["dtype"], "seed": cfg["seed"],
            "version": manifest.get("version"), "created": manifest.get("created"),
            "layout": "chunk_XXXXXXX.npy: maps of frames [i*chunk, (i+1)*chunk)"}
    atomic_write(d / "meta.json", json.dumps(meta, indent=2, sort_keys=True).encode())


def missing_chunks(out, method: str, n_chunks: int) -> list[int]:
    """The chunks of a method not written yet: what a resumed job computes.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias.
        n_chunks (int): the job's number of chunks.

    Returns:
        list[int]: the missing chunk indices, ascending.
    """
    present = set(chunks_on_disk(lambda i: chunk_path(out, method, i), n_chunks))
    return [i for i in range(n_chunks) if i not in present]


def chunks_on_disk(path_of, n_chunks: int) -> list[int]:
    """The chunk indices below `n_chunks` whose file `path_of(i)` exists, from one listing of its folder: the
    readers' work follows the files written, never a manifest's n (one edited to 10^15 looped over 10^12 chunks).

    Args:
        path_of (Callable[[int], pathlib.Path]): chunk index -> its file (`chunk_path`, `outputs_path`, ...).
        n_chunks (int): the job's number of chunks.

    Returns:
        list[int]: the indices, ascending.
    """
    folder, found = path_of(0).parent, []
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        digits = name.removeprefix("chunk_").partition(".")[0]
        if digits.isdigit() and digits.isascii() and int(digits) < n_chunks and path_of(int(digits)).name == name:
            found.append(int(digits))
    return sorted(found)


def finished_chunks(out, paths, n_chunks: int, what: str | None, allow_incomplete: bool) -> list[int]:
    """The chunks with every file of `paths` written (`chunks_on_disk` of each), refused when some are missing
    unless `allow_incomplete`.

    Args:
        out (str | os.PathLike): the output directory (named in the error).
        paths (Sequence[Callable[[int], pathlib.Path]]): chunk index -> file, one per kind of file a chunk needs.
        n_chunks (int): the job's number of chunks.
        what (str | None): what the files hold, named in the error ("object effects"); None: the job's outputs.
        allow_incomplete (bool): give the finished chunks of an unfinished job instead of refusing it.

    Returns:
        list[int]: the finished chunk indices, ascending.

    Raises:
        jaxsal.SaliencyInputError: chunks are missing and `allow_incomplete` is False.
    """
    done = sorted(set.intersection(*(set(chunks_on_disk(p, n_chunks)) for p in paths)))
    if len(done) < n_chunks and not allow_incomplete:
        raise SaliencyInputError(
            f"{out}: job is incomplete ({n_chunks - len(done)} of {n_chunks} chunks{f' of {what}' if what else ''} "
            "missing); rerun the same `jaxsal explain` command, or pass allow_incomplete=True for the finished chunks")
    return done


_OPEN_CHUNKS = LRU("open map chunks", 64)  # (MapArray number, chunk) -> its memory-mapped chunk file
_MAP_ARRAYS = itertools.count()  # numbers MapArrays: a number is never reused, so no view reads another's chunks


class MapArray:
    """Read-only array-like view `(N, H, W)` (or `(N, H, W, C)`) over a method's chunk files.

    Chunks are memory-mapped on first touch (a bounded cache of open chunks, emptied by
    `jaxsal.clear_caches()`); indexing with an int, slice or index array
    reads only the chunks it needs. `np.asarray(maps)` loads everything. `load_maps` makes one.

    Args:
        out (str | os.PathLike): a `jaxsal explain` output directory.
        method (str): the method's alias in the job.
        allow_incomplete (bool): accept missing chunks (their frames read as NaN; integer maps
            then read as float32).

    Raises:
        jaxsal.SaliencyInputError: on the directories `load_maps` refuses.
    """

    def __init__(self, out, method: str, allow_incomplete: bool = False):
        check_input_ok(out)
        manifest = read_manifest(out)
        cfg = manifest["config"]
        if method not in cfg["methods"]:
            raise SaliencyInputError(f"{out} has no maps for method {method!r}; it holds "
                                     f"{', '.join(cfg['methods'])}")
        if cfg.get("store") == "shares":
            raise SaliencyInputError(f"{out} stored only object shares (--store shares), no maps: read them with "
                                     f"jaxsal.load_object_shares('{out}', {method!r}), or rerun `jaxsal explain` "
                                     "without --store shares into a new --out for the maps")
        self.out, self.method = Path(out), method
        self.chunk = int(cfg["chunk"])
        n = self.meta_n = int(cfg["n"])
        self.n_chunks = -(-n // self.chunk)
        self.present = set(chunks_on_disk(lambda i: chunk_path(out, method, i), self.n_chunks))
        missing = self.n_chunks - len(self.present)
        if missing and (not allow_incomplete or not self.present):
            raise SaliencyInputError(
                f"{out}: job is incomplete ({missing} of {self.n_chunks} chunks of {method!r} "
                "missing); rerun the same `jaxsal explain` command to finish it"
                + ("" if allow_incomplete else ", or pass allow_incomplete=True (missing frames are NaN)"))
        first_i = min(self.present)
        first = self._open(first_i)
        self.shape = (n,) + first.shape[1:]
        self.dtype = first.dtype
        self.ndim = len(self.shape)
        self.meta = manifest
        self._id = next(_MAP_ARRAYS)
        _OPEN_CHUNKS[(self._id, first_i)] = first
        if missing and not np.issubdtype(self.dtype, np.floating):
            self.dtype = np.dtype(np.float32)

    def __len__(self):
        return self.shape[0]

    def _chunk(self, i: int) -> np.ndarray:
        if i not in self.present:
            rows = min(self.chunk, self.shape[0] - i * self.chunk)
            return np.full((rows,) + self.shape[1:], np.nan, self.dtype)
        return _OPEN_CHUNKS.get_or_build((self._id, i), lambda: self._open(i))

    def _open(self, i: int) -> np.ndarray:
        return open_map_chunk(self.out, self.method, i, self.meta_n, self.chunk, getattr(self, "shape", None))

    def _rows(self, idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx),) + self.shape[1:], self.dtype)
        chunks = idx // self.chunk
        for c in np.unique(chunks):
            sel = chunks == c
            out[sel] = self._chunk(int(c))[idx[sel] - c * self.chunk]
        return out

    def __getitem__(self, key):
        rest = ()
        if isinstance(key, tuple):
            key, rest = key[0], key[1:]
        if isinstance(key, (int, np.integer)):
            k = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= k < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} maps")
            res = self._chunk(k // self.chunk)[k % self.chunk]
            return np.asarray(res[rest]) if rest else np.asarray(res)
        if isinstance(key, slice):  # the slice's own indices, not a slice of all N
            r = range(len(self))[key]
            idx = np.arange(r.start, r.stop, r.step, dtype=np.int64)
        else:
            idx = np.arange(len(self))[np.asarray(key)]
        res = self._rows(idx)
        return res[(slice(None),) + rest] if rest else res

    def __array__(self, dtype=None, copy=None):
        a = self[:]
        return a if dtype is None else a.astype(dtype)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return f"MapArray(method={self.method!r}, shape={self.shape}, dtype={self.dtype}, dir='{self.out}')"


def open_map_chunk(out, method: str, i: int, n: int, chunk: int, want=None) -> np.ndarray:
    """Chunk `i` of a method's maps, memory-mapped and checked to hold its rows of maps.

    A truncated, emptied or replaced file is a clear error naming the fix, not a numpy error or
    maps joined to the wrong frames.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias in the job (its folder name).
        i (int): the chunk's index.
        n (int): the job's number of frames.
        chunk (int): the job's frames per chunk.
        want (tuple | None): the shape of the maps read so far (its trailing axes must match), or None.

    Returns:
        numpy.ndarray: the chunk's maps, memory-mapped (rows, H, W) or (rows, H, W, C).

    Raises:
        jaxsal.SaliencyInputError: the file is corrupt (unreadable, bytes after its maps, another shape
            or dtype), naming it and the fix.
    """
    path = chunk_path(out, method, i)
    rows = min(chunk, n - i * chunk)
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, IsADirectoryError) as e:
        a, why = None, str(e).splitlines()[0] if str(e) else type(e).__name__
    else:
        why = None
        extra = os.path.getsize(path) - a.offset - a.nbytes
        if extra > 0:  # np.load maps the header's array and ignores the rest
            why = f"{extra} bytes after its maps"
        elif a.ndim not in (3, 4) or a.shape[0] != rows or (want is not None and a.shape[1:] != tuple(want[1:])):
            why = f"shape {a.shape}, not {rows} maps" + (f" of {tuple(want[1:])}" if want is not None else "")
        elif not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            why = f"dtype {a.dtype}"
    if why is not None and a is not None and a.ndim in (3, 4):
        check_short_chunk(path, out, n, chunk, {a.shape[0]}, rows)
    if why is not None:
        raise SaliencyInputError(f"{path} is corrupt ({why}): delete it and rerun the same `jaxsal explain` "
                                 "command, which computes that chunk again")
    return a


def check_map_chunks(out, methods, chunks, n: int, chunk: int) -> None:
    """Checks the map chunks a resumed job finds on disk, as `load_maps` would.

    Each is opened (its header only), so a damaged one is named before the job counts it as done.

    Args:
        out (str | os.PathLike): the output directory.
        methods (list[str]): the methods' aliases (folder names).
        chunks (Iterable[int]): the chunk indices to check where they exist.
        n (int): the job's number of frames.
        chunk (int): the job's frames per chunk.

    Raises:
        jaxsal.SaliencyInputError: a chunk is corrupt, naming it and the fix (see `open_map_chunk`).
    """
    for method in methods:
        want = None
        for i in chunks:
            if not chunk_path(out, method, i).exists():
                continue
            a = open_map_chunk(out, method, i, n, chunk, want)
            want = a.shape if want is None else want
            del a


def load_maps(out, method: str, allow_incomplete: bool = False) -> MapArray:
    """The maps of `method` in a `jaxsal explain` output directory, as a lazy array (N, H, W).

    Chunks are memory-mapped on first touch: indexing reads only the chunks it needs, and
    `np.asarray(maps)` loads everything.

    Args:
        out (str | os.PathLike): the output directory.
        method (str): the method's alias in the job (e.g. "gradcam").
        allow_incomplete (bool): accept a job still running (or stopped): its missing chunks'
            frames read as NaN (`jaxsal.io.store.finished_frames` says which).

    Returns:
        MapArray: read-only array-like of shape (N, H, W), or (N, H, W, C) for per-frame maps,
            with `shape`, `dtype` and `meta` (the manifest).

    Raises:
        jaxsal.SaliencyInputError: `out` is no jaxsal output directory, its input failed to
            read, it has no maps of `method` (or stored only object shares), or the job is
            incomplete (without `allow_incomplete`, or with no chunk at all).
    """
    return MapArray(out, method, allow_incomplete)


def stamp() -> str:
    """The current UTC time as the manifests record it.

    Returns:
        str: e.g. "2026-01-31T12:00:00Z".
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
