"""Frame-stack sources read in chunks: .npy/.npz stacks, shard directories, Dopamine replay files.

Every source has `len(source)`, `shape` (N, H, W, C), `read(start, stop) -> uint8 array`, a
`fingerprint()` (checksum of the input, for the output's provenance) and `describe()`; an archive
source also has `verify()`, one streaming pass over its bytes against the checksums it stores (run
before any map is written: `verify_input`); a source
whose states are not simply its rows 0..N-1 also has `row_ids(start, stop)` (a Dopamine buffer's
indices and checkpoints; `row_ids` below gives every source's). Reads
touch only the requested rows (memory-mapped or streamed), so peak memory follows the chunk,
never the size of the buffer.
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from jaxsal.caching import LRU
from jaxsal.errors import SaliencyInputError
from jaxsal.io.pickled import PickleFormatError, PickleLimitError, read_int_set
from jaxsal.targets import INT32_MAX

STACK = 4
ACTIONS_KEY = "actions"  # the per-state actions in an .npz buffer, for --target q_action


def _fingerprint_files(paths, extra: str = "") -> str:
    """sha256 over names, sizes and sampled 64 KiB blocks (first, last, 14 between) of each file.

    Sampling keeps the check of a multi-GB buffer under a second while still catching a
    different, truncated or rewritten file.
    """
    h = hashlib.sha256(extra.encode())
    for p in paths:
        p = Path(p)
        size = p.stat().st_size
        h.update(f"{p.name}:{size};".encode())
        block = 1 << 16
        offsets = sorted({int(o) for o in np.linspace(0, max(0, size - block), 16)})
        with open(p, "rb") as f:
            for o in offsets:
                f.seek(o)
                h.update(f.read(block))
    return h.hexdigest()


VERIFY_BLOCK = 1 << 24  # bytes per read of the verification pass: memory follows this, not the member
# (path, size, mtime, members) already verified in this process (sweep cells share inputs)
_VERIFIED = LRU("verified inputs", 1024)


def _verify_zip_members(path, members):
    """Read each member of the zip at `path` to its end in VERIFY_BLOCK pieces, so `zipfile` compares
    its CRC-32 with the one the archive stores (it does only at a member's end: a partial read, e.g.
    of the first frames, would take corrupt bytes as frames)."""
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns, tuple(members))
    if key in _VERIFIED:
        return
    name = members[0] if members else ""
    try:
        with zipfile.ZipFile(path) as z:
            for name in members:
                with z.open(name) as f:
                    while f.read(VERIFY_BLOCK):
                        pass
    except Exception as e:  # noqa: BLE001 (BadZipFile for a CRC mismatch, zlib.error, EOFError, OSError)
        raise _corrupt(path, name, e) from None
    _VERIFIED[key] = True


def _corrupt(path, member: str, e: Exception, before: bool = True) -> SaliencyInputError:
    """The error for a corrupt member; `before`: found before anything was explained (else while a job read it)."""
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return SaliencyInputError(f"{path}: member {member!r} is corrupt ({why[:200]}); "
                              + ("nothing was explained: " if before else "") + "copy or download the file again "
                              "(its bytes do not match the checksum the archive stores)")


def verify_input(source):
    """Check the integrity of every file `source` reads (the CRC-32 of each .npz member it reads,
    shards too), in one streaming pass, before any map is written; wrappers (a layout, a --limit)
    verify the files under them whole. Raises SaliencyInputError naming the corrupt file."""
    while not hasattr(source, "verify") and hasattr(source, "source"):
        source = source.source
    if hasattr(source, "verify"):
        source.verify()


def dtype_spans(source) -> list[tuple[int, int, np.dtype]]:
    """[(start, stop, dtype)]: the stored dtype of each run of rows (one per shard of a shard
    folder, through layout and --limit wrappers), so every float shard's pixels can be checked
    before anything is written, not only the first chunk's."""
    n = len(source)
    while not hasattr(source, "parts") and not hasattr(source, "dtype") and hasattr(source, "source"):
        source = source.source
    if hasattr(source, "parts"):
        starts = [0] + [int(s) for s in np.cumsum([len(p) for p in source.parts])]
        spans = [(a, min(b, n), p.dtype) for a, b, p in zip(starts, starts[1:], source.parts)]
        return [s for s in spans if s[0] < s[1]]
    return [(0, n, np.dtype(source.dtype))]


def _check_stack_shape(shape, dtype, what: str):
    if any(d < 0 for d in shape):  # only a crafted or corrupt .npy header says so
        raise SaliencyInputError(f"{what}: its header gives a negative shape {tuple(shape)}: the file is corrupt, "
                                 "save the frames again with np.save")
    if len(shape) == 4 and shape[0] == 0:
        raise SaliencyInputError(f"{what} holds no states (shape {tuple(shape)}): give a buffer with at least "
                                 "one frame stack")
    if len(shape) != 4:
        raise SaliencyInputError(
            f"{what}: expected frame stacks with shape (N, 84, 84, 4), got shape {tuple(shape)}")
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)) or np.dtype(dtype).itemsize > 8:
        # (float128, np.longdouble: no JAX array type, so a method would fail after the manifest was written)
        raise SaliencyInputError(f"{what}: expected uint8 frames, got dtype {dtype}")
    if not np.dtype(dtype).isnative:  # JAX takes native byte order only
        raise SaliencyInputError(f"{what}: frames in non-native byte order (dtype {np.dtype(dtype).str}): save them "
                                 "as np.save(path, obs.astype(obs.dtype.newbyteorder('=')))")


class ArraySource:
    """Frames already in memory (e.g. an EnvPool rollout)."""

    def __init__(self, array, name: str = "array", path: str | None = None):
        _check_stack_shape(array.shape, array.dtype, name)
        self._a = array
        self.name = name
        self.path = path

    def __len__(self):
        return self._a.shape[0]

    @property
    def shape(self):
        return tuple(self._a.shape)

    @property
    def dtype(self):
        return self._a.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(self._a[start:stop])

    def fingerprint(self) -> str:
        if self.path is not None:
            return _fingerprint_files([self.path])
        return hashlib.sha256(np.ascontiguousarray(self._a).tobytes()).hexdigest()

    def describe(self) -> dict:
        return {"kind": "array" if self.path is None else "npy", "path": self.path, "name": self.name}


class NpySource:
    """A .npy frame-stack file read with plain seeks and reads (no memory map, so the pages
    of frames already explained never count against the process's resident memory)."""

    def __init__(self, path: Path):
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                shape, dtype, self._offset = _npy_header(f, path)
        except OSError as e:
            raise SaliencyInputError(f"cannot read {path}: {e.strerror}") from None
        _check_stack_shape(shape, dtype, str(path))
        self._shape, self._dtype = tuple(shape), dtype
        self._row = int(np.prod(shape[1:])) * dtype.itemsize
        size, want = Path(path).stat().st_size, self._offset + self._shape[0] * self._row
        if size < want:
            raise SaliencyInputError(f"{path}: file is truncated (header says {self._shape[0]} frames)")
        if size > want:  # frames appended without a new header (np.load would drop them silently)
            raise SaliencyInputError(_after_frames(path, size - want, self._shape, "np.save(path, frames)"))

    def __len__(self):
        return self._shape[0]

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self._shape[1:], self._dtype)
        with open(self.path, "rb") as f:
            f.seek(self._offset + start * self._row)
            if f.readinto(memoryview(out).cast("B")) != out.nbytes:
                raise SaliencyInputError(f"{self.path}: file is truncated (rows {start}:{stop})")
        return out

    def fingerprint(self) -> str:
        return _fingerprint_files([self.path])

    def describe(self) -> dict:
        return {"kind": "npy", "path": self.path}


def _after_frames(what, extra: int, shape, fix: str) -> str:
    """The error for bytes past the frames a header declares: appended frames would be dropped silently."""
    return (f"{what}: {extra} bytes after the {shape[0]} frames its header declares (shape {tuple(shape)}): frames "
            f"appended without a new header, or a corrupt file; save the frames again with {fix}")


def _open_npy(path: Path) -> NpySource:
    return NpySource(path)


class NpzSource:
    """Key `obs` of an .npz archive, streamed from the zip member (stored or deflated).

    An `actions` array in the same archive (integers, one per frame stack: shape (N,)) gives the
    source an `actions(start, stop)` method, which `--target q_action` explains."""

    def __init__(self, path: Path, key: str = "obs"):
        self.path = str(path)
        self.key = key
        try:
            self._zip = zipfile.ZipFile(path)
            members = self._zip.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise SaliencyInputError(f"cannot read {path}: not a valid .npz file ({e})") from None
        if f"{key}.npy" not in members:
            keys = [m[:-4] for m in members if m.endswith(".npy")]
            raise SaliencyInputError(f"{path} has no array {key!r} (it holds {keys}); save the frame "
                                     f"stacks as np.savez(path, {key}=frames)")
        self._member = f"{key}.npy"
        self._fh = None
        self._pos = None
        shape, dtype, self._offset = self._header()
        _check_stack_shape(shape, dtype, f"{path}[{key!r}]")
        self._shape, self._dtype = tuple(shape), dtype
        self._row = int(np.prod(shape[1:])) * dtype.itemsize
        # the member's size, from the archive (its bytes are checked against it by `verify`): a header claiming
        # more frames would fail a job only when it reaches them, after chunks were written
        payload = self._zip.getinfo(self._member).file_size - self._offset
        held = payload // max(self._row, 1)
        if self._row and held < self._shape[0]:
            raise SaliencyInputError(f"{path}: member {self._member!r} is truncated: its header says {self._shape[0]} "
                                     f"frames but it holds {held}; the file is corrupt, save the frames again with "
                                     f"np.savez(path, {key}=frames)")
        extra = payload - self._shape[0] * self._row
        if extra > 0:
            raise SaliencyInputError(_after_frames(f"{path}[{key!r}]", extra, self._shape,
                                                   f"np.savez(path, {key}=frames)"))
        self._actions = None
        if ACTIONS_KEY + ".npy" in members:
            self.actions = self._read_actions  # present only then: q_action checks hasattr(source, "actions")

    def _read_actions(self, start: int, stop: int) -> np.ndarray:
        """The actions taken in states [start, stop): array `actions` of the archive, checked once."""
        if self._actions is None:
            self._actions = self._load_actions()
        return self._actions[start:stop]

    def _load_actions(self) -> np.ndarray:
        n, what = self._shape[0], f"{self.path}[{ACTIONS_KEY!r}]"
        fix = (f"store one integer action per frame stack, np.savez(path, {self.key}=frames, "
               f"{ACTIONS_KEY}=actions) with actions.shape == ({n},)")
        try:
            with self._zip.open(ACTIONS_KEY + ".npy") as f:
                shape, dtype, _ = _npy_header(f, what)
                # the data are read only for the shape wanted: a header can claim any size
                raw = f.read(n * dtype.itemsize) if tuple(shape) == (n,) else None
                extra = raw is not None and len(raw) == n * dtype.itemsize and f.read(1)
        except SaliencyInputError:
            raise
        except Exception as e:
            raise SaliencyInputError(f"cannot read {what}: {e}; {fix}") from None
        if raw is None:
            raise SaliencyInputError(f"{what} has shape {tuple(shape)} but {self.key!r} has {n} frame stacks: {fix}")
        if len(raw) != n * dtype.itemsize:
            raise SaliencyInputError(f"{what}: file is truncated; {fix}")
        if extra:
            raise SaliencyInputError(f"{what}: data after its {n} actions (the header and the bytes disagree); {fix}")
        a = np.frombuffer(raw, dtype)
        if not np.issubdtype(a.dtype, np.integer):
            raise SaliencyInputError(f"{what} has dtype {a.dtype}, not integers: {fix}")
        if n and int(a.min()) < 0:
            raise SaliencyInputError(f"{what} holds a negative action ({int(a.min())}): {fix}")
        if n and int(a.max()) > INT32_MAX:  # the cast would wrap it onto a real action (2**32+3 -> 3)
            raise SaliencyInputError(f"{what} holds action {int(a.max())}, beyond any action index (at most 2**31-1): "
                                     f"{fix}")
        return a.astype(np.int32)

    def _header(self):
        try:
            with self._zip.open(self._member) as f:
                return _npy_header(f, f"{self.path}[{self.key!r}]")
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
            raise _corrupt(self.path, self._member, e) from None

    def __len__(self):
        return self._shape[0]

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    def verify(self):
        """The CRC-32 of every member this source reads: the frames, and the actions when present and
        of one entry per frame (a header can claim any size: actions of another shape are never read,
        and are refused with their shape when a target needs them)."""
        members = [self._member]
        if hasattr(self, "actions"):
            try:
                with self._zip.open(ACTIONS_KEY + ".npy") as f:
                    shape = _npy_header(f, f"{self.path}[{ACTIONS_KEY!r}]")[0]
            except Exception:  # noqa: BLE001 (an unreadable header is verified, and refused, below)
                shape = (self._shape[0],)
            if tuple(shape) == (self._shape[0],):
                members.append(ACTIONS_KEY + ".npy")
        _verify_zip_members(self.path, members)

    def read(self, start: int, stop: int) -> np.ndarray:
        # A deflated member only seeks forward cheaply: keep one handle and read sequentially.
        target = self._offset + start * self._row
        if self._fh is None or self._pos is None or target < self._pos:
            if self._fh is not None:
                self._fh.close()
            self._fh = self._zip.open(self._member)
            self._pos = 0
        try:
            if target != self._pos:
                self._fh.seek(target)
            n = (stop - start) * self._row
            data = self._fh.read(n)
        except Exception as e:  # noqa: BLE001 (BadZipFile, zlib.error: corrupt bytes)
            raise _corrupt(self.path, self._member, e, before=False) from None
        if len(data) != n:
            raise SaliencyInputError(f"{self.path}: file is truncated (rows {start}:{stop} missing)")
        self._pos = target + n
        return np.frombuffer(data, self._dtype).reshape((stop - start,) + self._shape[1:])

    def fingerprint(self) -> str:
        return _fingerprint_files([self.path], extra=self.key)

    def describe(self) -> dict:
        return {"kind": "npz", "path": self.path, "key": self.key}


class ConcatSource:
    """A directory of .npy/.npz shards, read as one buffer in sorted file-name order."""

    def __init__(self, path: Path, parts: list):
        self.path = str(path)
        self.parts = parts
        shapes = {p.shape[1:] for p in parts}
        if len(shapes) != 1:
            raise SaliencyInputError(f"shards in {path} have different frame shapes {sorted(shapes)}")
        self._starts = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self):
        return int(self._starts[-1])

    @property
    def shape(self):
        return (len(self),) + self.parts[0].shape[1:]

    def read(self, start: int, stop: int) -> np.ndarray:
        out = self._gather(start, stop, lambda part, lo, hi: part.read(lo, hi))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _gather(self, start: int, stop: int, get) -> list:
        """[get(part, lo, hi) for each part's rows lo:hi in [start, stop)]."""
        out = []
        i = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            lo, hi = start - self._starts[i], min(stop, self._starts[i + 1]) - self._starts[i]
            out.append(get(self.parts[i], int(lo), int(hi)))
            start = int(self._starts[i] + hi)
            i += 1
        return out

    def verify(self):
        """Every shard that stores checksums, each verified whole."""
        for p in self.parts:
            verify_input(p)

    def actions(self, start: int, stop: int) -> np.ndarray:
        """Per-state actions of every part (each must have them)."""
        def get(part, lo, hi):
            if not hasattr(part, "actions"):
                raise SaliencyInputError(f"{getattr(part, 'path', part)} stores no actions (needed for "
                                         "--target q_action)")
            return part.actions(lo, hi)
        out = self._gather(start, stop, get)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for p in self.parts:
            h.update(p.fingerprint().encode())
        return h.hexdigest()

    def describe(self) -> dict:
        return {"kind": "shards", "path": self.path, "files": len(self.parts)}


def _gz_open(path: Path):
    try:
        return gzip.open(path, "rb")
    except OSError as e:
        raise SaliencyInputError(f"cannot open {path}: {e}") from None


def read_npy_header(f):
    """(shape, fortran_order, dtype) as the .npy header at `f` declares them (any dtype, object included), `f`
    left at the array's first byte; numpy's error for a header it cannot read passes through."""
    version = np.lib.format.read_magic(f)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return reader(f)


def _npy_header(f, path, kind: str = "a valid .npy array"):
    try:
        shape, fortran, dtype = read_npy_header(f)
    except (zipfile.BadZipFile, zlib.error) as e:
        if isinstance(f, zipfile.ZipExtFile):  # corrupt archive bytes: NpzSource names the member
            raise
        raise SaliencyInputError(f"cannot read {path}: not {kind} ({e})") from None
    except Exception as e:
        raise SaliencyInputError(f"cannot read {path}: not {kind} ({e})") from None
    if fortran or dtype.hasobject:
        raise SaliencyInputError(f"{path}: the array must be C-ordered numbers (got dtype {dtype}"
                                 f"{', Fortran order' if fortran else ''})")
    return shape, dtype, f.tell()


GZ_RATIO = 1032  # deflate's largest expansion: a 258-byte match costs at least 2 bits
CRAFTED = "the file is corrupt or crafted; use the files saved with this checkpoint"


def _gz_read(f, n: int, path) -> bytes:
    try:
        return f.read(n)
    except (OSError, EOFError, zlib.error) as e:
        raise SaliencyInputError(f"cannot read {path}: corrupt gzip data ({e})") from None


def load_gz_array(path: Path, max_items: int, bound: str) -> np.ndarray:
    """A gzipped .npy array of a Dopamine replay directory (actions, terminals, counters) of at most
    `max_items` entries, what the checkpoint's other files allow (`bound` says why, for the message):
    its header is checked first, then exactly its bytes are read, as one bounded stream."""
    if not Path(path).exists():
        raise SaliencyInputError(f"missing Dopamine file {path}")
    with _gz_open(path) as f:
        shape, dtype, _ = _npy_header(f, path, "a gzip'd .npy array")
        n = math.prod(shape)
        if n > max_items:
            raise SaliencyInputError(f"{path} has {n} entries {bound}; use the files saved with this checkpoint")
        if dtype.kind not in "biuf" or dtype.itemsize > 8:
            raise SaliencyInputError(f"{path}: expected numbers, got dtype {dtype}; use the files saved with "
                                     "this checkpoint")
        data = _gz_read(f, n * dtype.itemsize, path)
        extra = _gz_read(f, 1, path)  # also reaches the end, where gzip checks the CRC
    if len(data) != n * dtype.itemsize:
        raise SaliencyInputError(f"{path}: file is truncated ({len(data)} of {n * dtype.itemsize} bytes)")
    if extra:
        raise SaliencyInputError(f"{path}: data after its array: {CRAFTED}")
    return np.frombuffer(data, dtype).reshape(shape)


# --------------------------------------------------------------------------- Dopamine
MAX_FRAMES = 1 << 24  # frames of one checkpoint (Dopamine's Atari checkpoints hold 1,000,000)
END_BYTES = 128  # pickled bytes per episode-end index, at most
DOPAMINE_OBS = re.compile(r"^\$store\$_observation_ckpt\.(\d+)\.gz$")
COUNTERS_FIX = ("copy add_count_ckpt.{k}.gz and invalid_range_ckpt.{k}.gz from where Dopamine's "
                "OutOfGraphReplayBuffer.save wrote this checkpoint (without them the write cursor, and "
                "so the order of the circular buffer, is unknown), or give the frame stacks as .npy/.npz")


def _counters(path: Path, what: str, max_items: int, bound: str) -> np.ndarray:
    a = np.asarray(load_gz_array(path, max_items, bound))
    if not np.issubdtype(a.dtype, np.integer) and not (
            np.issubdtype(a.dtype, np.floating) and np.all(np.isfinite(a)) and np.all(a == np.round(a))):
        raise SaliencyInputError(f"{path}: expected {what} as integers, got dtype {a.dtype}")
    return a.astype(np.int64).reshape(-1)


class DopamineCheckpoint:
    """Checkpoint K of a Dopamine replay directory (the DQN Replay Dataset layout): exactly the
    states Dopamine serves.

    `OutOfGraphReplayBuffer.save(dir, K)` writes a circular buffer of single frames
    `$store$_observation_ckpt.K.gz` with its actions, rewards and terminals, the write counter
    `add_count_ckpt.K.gz`, the indices around the write cursor `invalid_range_ckpt.K.gz` and (newer
    versions) `episode_end_indices_ckpt.K.gz` (episode ends, time-outs included). Served are the
    indices for which Dopamine's `is_valid_transition(index)` is true, oldest first, each as
    `get_observation_stack(index)`: the raw frames index-3..index (Dopamine pads episode starts
    with zero frames in the buffer itself); `row_ids` says which index each state is, so maps
    join with the buffer's actions and rewards.

    The rule is Dopamine's `is_valid_transition` (as in dopamine-rl 4.1): with stack size 4 and
    update horizon N (read from invalid_range, which Dopamine writes as cursor-N .. cursor+3),
    index i is served when
      - the buffer is full, or else 3 <= i < cursor - N (written, past the first padding);
      - i is not in invalid_range (stacks across the write cursor, n-step targets not yet written);
      - no terminal flag at i-3, i-2, i-1 (the stack would mix two episodes);
      - no episode end without terminal (a time-out) at i .. i+N-1.
    """

    def __init__(self, obs_path: Path, terminal_path: Path):
        self.path = str(obs_path)
        self.terminal_path = str(terminal_path)
        d, k = Path(obs_path).parent, DOPAMINE_OBS.match(Path(obs_path).name).group(1)
        self.k = int(k)
        if self.k > np.iinfo(np.int64).max:  # stored per state as int64 ("checkpoint" of load_outputs)
            raise SaliencyInputError(f"{obs_path}: checkpoint number {k} is beyond int64; {CRAFTED}")
        self.action_path = d / f"$store$_action_ckpt.{k}.gz"
        self.add_count_path = d / f"add_count_ckpt.{k}.gz"
        self.invalid_path = d / f"invalid_range_ckpt.{k}.gz"
        self.episode_end_path = d / f"episode_end_indices_ckpt.{k}.gz"
        missing = [p.name for p in (self.add_count_path, self.invalid_path) if not p.exists()]
        if missing:
            raise SaliencyInputError(f"Dopamine directory {d} has no {' and no '.join(missing)} for "
                                     f"{Path(obs_path).name}: {COUNTERS_FIX.format(k=k)}")
        self._fh = None
        self._pos = 0  # next physical frame index of the open stream
        with _gz_open(obs_path) as f:
            shape, dtype, self._offset = _npy_header(f, obs_path, "a gzip'd .npy array")
        if len(shape) != 3 or 0 in shape:
            raise SaliencyInputError(f"{obs_path}: expected single frames with shape (N, 84, 84), "
                                     f"got {tuple(shape)}")
        if dtype != np.uint8:
            raise SaliencyInputError(f"{obs_path}: expected uint8 frames, got dtype {dtype}")
        size = os.path.getsize(obs_path)
        if shape[0] > MAX_FRAMES or math.prod(shape) > GZ_RATIO * size:
            raise SaliencyInputError(
                f"{obs_path}: its header says {shape[0]} frames of {shape[1]}x{shape[2]}, more than "
                + (f"the {MAX_FRAMES} jaxsal reads from one checkpoint" if shape[0] > MAX_FRAMES
                   else f"a gzip file of {size} bytes can hold") + f": {CRAFTED}")
        terminal = load_gz_array(terminal_path, shape[0], f"but {obs_path} has {shape[0]} frames")
        raw_terminal = terminal.reshape(-1)
        terminal = raw_terminal.astype(bool)
        if terminal.shape[0] != shape[0]:
            raise SaliencyInputError(f"{terminal_path} has {terminal.shape[0]} entries but "
                                     f"{obs_path} has {shape[0]} frames")
        self._shape = tuple(shape)
        self._row = int(np.prod(shape[1:]))
        cap = shape[0]
        add_count = _counters(self.add_count_path, "the number of transitions added", 1,
                              "but Dopamine writes one count")
        if add_count.size != 1 or add_count[0] < 0:
            raise SaliencyInputError(f"{self.add_count_path}: expected one count >= 0, got {add_count.tolist()}")
        self.add_count = add_count = int(add_count[0])
        if add_count == 0:
            raise SaliencyInputError(f"{obs_path}: the buffer is empty (add_count 0)")
        self.cursor = cursor = add_count % cap
        full = add_count >= cap
        written = raw_terminal[:cap if full else add_count]  # unwritten slots hold np.empty's bytes
        if not np.all((written == 0) | (written == 1)):  # Dopamine writes 0/1; NaN or 7 is no flag
            raise SaliencyInputError(f"{terminal_path}: expected terminal flags of 0 or 1, got "
                                     f"{np.unique(written[(written != 0) & (written != 1)])[:5].tolist()}; "
                                     "use the files saved with this checkpoint")
        invalid = _counters(self.invalid_path, "buffer indices", cap + STACK,
                            f"but a buffer of {cap} frames has at most {cap + STACK} invalid indices")
        self.horizon = horizon = self._horizon(invalid, cursor, cap, add_count)
        ends = self._episode_ends(cap)

        i = np.arange(cap)
        valid = np.ones(cap, bool) if full else (i >= STACK - 1) & (i < cursor - horizon)
        valid[invalid] = False
        for back in range(1, STACK):  # a terminal in an earlier frame of the stack
            valid &= ~terminal[(i - back) % cap]
        timeout = np.zeros(cap, bool)
        timeout[ends] = True
        timeout &= ~terminal
        for ahead in range(horizon):  # the episode stops without terminal before the n-step target
            valid &= ~timeout[(i + ahead) % cap]
        # chronological position p -> physical index (origin + p) % cap, for p < written
        self._phys = ((cursor if full else 0) + np.arange(min(add_count, cap))) % cap
        self._keep = np.flatnonzero(valid[self._phys])  # chronological positions of the states served
        if len(self._keep) == 0:
            raise SaliencyInputError(f"{obs_path}: no state Dopamine would sample (add_count {add_count}, "
                                     f"capacity {cap}, update horizon {horizon})")
        self._actions = None
        self._tail_at, self._tail = None, None  # cached physical frames just read

    def _horizon(self, invalid, cursor: int, cap: int, add_count: int) -> int:
        """Dopamine writes invalid_range as (cursor - N + j) % capacity, j < 4 + N; N is the update
        horizon. Anything else is another checkpoint's file or another stack size: refused."""
        n = len(invalid) - STACK
        want = (cursor - n + np.arange(len(invalid))) % cap if n >= 0 else None
        if want is None or not np.array_equal(invalid, want):
            stack = ""
            hits = np.flatnonzero(invalid == cursor)
            if len(hits) and len(invalid) - hits[0] != STACK and np.array_equal(
                    invalid, (cursor - hits[0] + np.arange(len(invalid))) % cap):
                stack = (f"; it is the range of a buffer stacking {len(invalid) - hits[0]} frames, and jaxsal "
                         f"explains stacks of {STACK}")
            raise SaliencyInputError(
                f"{self.invalid_path} holds {invalid.tolist()[:12]}, not the indices cursor-N .. cursor+{STACK - 1} "
                f"that Dopamine writes for add_count {add_count} (cursor {cursor}, capacity {cap}){stack}; "
                "use the add_count and invalid_range files saved with this checkpoint")
        return n

    def _episode_ends(self, cap: int) -> np.ndarray:
        """Indices of episode_end_indices_ckpt.K.gz, read without unpickling; older Dopamine versions
        did not write it, and Dopamine's own load then knows no time-outs either."""
        if not self.episode_end_path.exists():
            return np.zeros(0, np.int64)
        ends = np.asarray(sorted(self._read_episode_ends(cap)), np.int64)
        bad = ends[(ends < 0) | (ends >= cap)]
        if len(bad):
            raise SaliencyInputError(f"{self.episode_end_path}: episode end {int(bad[0])} outside the "
                                     f"buffer (capacity {cap}); use the files saved with this checkpoint")
        return ends

    def _read_episode_ends(self, cap: int) -> set:
        """The pickled set, read without unpickling (jaxsal.io.pickled): at most `cap` indices, so at
        most END_BYTES per index (numpy scalars in protocol 0 take ~70) are decompressed."""
        path, limit = self.episode_end_path, END_BYTES * cap + 65536
        fix = ("use the file saved with this checkpoint, or remove it (then time-outs are not known, as when "
               "Dopamine loads a checkpoint without it)")
        with _gz_open(path) as f:
            data = _gz_read(f, limit + 1, path)
        if len(data) > limit:
            raise SaliencyInputError(f"{path}: more than {limit} bytes uncompressed, more than a pickled set of at "
                                     f"most {cap} indices takes: the file is corrupt or crafted; {fix}")
        try:
            return read_int_set(data, cap)
        except PickleFormatError as e:
            crafted = "; the file is corrupt or crafted" if isinstance(e, PickleLimitError) else ""
            raise SaliencyInputError(f"{path}: not the set of episode-end indices Dopamine writes ({e}){crafted}; "
                                     f"{fix}") from None

    def __len__(self):
        return len(self._keep)

    @property
    def shape(self):
        return (len(self),) + self._shape[1:] + (STACK,)

    dtype = np.dtype(np.uint8)

    def _physical(self, start: int, stop: int) -> np.ndarray:
        """Physical frames [start, stop), streamed forward from the gzip file (reopened only to
        go backwards, i.e. once per wrap-around)."""
        if self._fh is None or start < self._pos:
            if self._fh is not None:
                self._fh.close()
            self._fh = _gz_open(Path(self.path))
            self._pos = -1  # before the header
        try:
            if start != self._pos:
                self._fh.seek(self._offset + start * self._row)
            n = stop - start
            data = self._fh.read(n * self._row)
        except (OSError, EOFError) as e:
            raise SaliencyInputError(f"cannot read {self.path}: corrupt gzip data ({e})") from None
        if len(data) != n * self._row:
            raise SaliencyInputError(f"{self.path}: file is truncated (frames {start}:{stop})")
        self._pos = stop
        return np.frombuffer(data, np.uint8).reshape((n,) + self._shape[1:])

    def _run(self, lo: int, hi: int) -> np.ndarray:
        """Physical frames [lo, hi); the last STACK-1 frames of the previous read come from a
        small cache, so sequential chunks (which overlap by STACK-1 frames) never rewind."""
        t0 = self._tail_at
        if t0 is not None and t0 <= lo < self._pos <= hi and self._pos - t0 == len(self._tail):
            got = np.concatenate([self._tail[lo - t0:], self._physical(self._pos, hi)])
        else:
            got = self._physical(lo, hi)
        self._tail_at, self._tail = hi - min(STACK - 1, len(got)), got[-(STACK - 1):].copy()
        return got

    def _chrono(self, a: int, b: int) -> np.ndarray:
        """Chronological frames [a, b), 0 <= a: the physical runs, at most two (one wrap)."""
        phys = self._phys[a:b]
        parts, i = [], 0
        while i < len(phys):
            j = i + 1
            while j < len(phys) and phys[j] == phys[j - 1] + 1:
                j += 1
            parts.append(self._run(int(phys[i]), int(phys[j - 1]) + 1))
            i = j
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def read(self, start: int, stop: int) -> np.ndarray:
        """States [start, stop): Dopamine's get_observation_stack of each served index."""
        pos = self._keep[start:stop]  # chronological positions; every stack lies after the oldest frame
        a, b = int(pos[0]) - (STACK - 1), int(pos[-1]) + 1
        frames = self._chrono(a, b)
        idx = pos[:, None] + np.arange(-(STACK - 1), 1)[None, :] - a  # (n, 4) into frames
        return np.ascontiguousarray(np.moveaxis(frames[idx], 1, -1))

    def row_ids(self, start: int, stop: int) -> dict:
        """Per state [start, stop): its Dopamine buffer index and this checkpoint's number K."""
        index = self._phys[self._keep[start:stop]].astype(np.int64)
        return {"index": index, "checkpoint": np.full(len(index), self.k, np.int64)}

    def actions(self, start: int, stop: int) -> np.ndarray:
        """The actions taken in states [start, stop) (from `$store$_action_ckpt.K.gz`)."""
        if self._actions is None:
            if not self.action_path.exists():
                raise SaliencyInputError(f"missing Dopamine file {self.action_path}: the buffer's actions "
                                         "are needed for --target q_action")
            a = load_gz_array(self.action_path, self._shape[0], f"but {self.path} has {self._shape[0]} frames")
            if a.ndim != 1 or a.shape[0] != self._shape[0]:
                raise SaliencyInputError(f"{self.action_path} has shape {a.shape} but {self.path} has "
                                         f"{self._shape[0]} frames: one action per frame; {CRAFTED}")
            a = a[self._phys][self._keep]  # the served states' (unwritten slots hold np.empty's bytes)
            # whole numbers that fit int32: a fraction or 2**40 must not become another action in the cast
            if not np.issubdtype(a.dtype, np.integer) and not (np.isfinite(a).all() and (a == np.round(a)).all()) \
                    or a.size and (a.min() < 0 or a.max() > INT32_MAX):
                raise SaliencyInputError(f"{self.action_path}: actions must be whole numbers from 0 to 2**31-1, got "
                                         f"dtype {a.dtype}, {a.min()}..{a.max()}; {CRAFTED}")
            self._actions = a.astype(np.int32)
        return self._actions[start:stop]

    def verify(self):
        """The gzip CRC-32 of the observation file, read to its end in VERIFY_BLOCK pieces (frames are
        otherwise streamed only as far as they are served, and gzip checks its CRC only at the end);
        the checkpoint's small files are read whole, CRC included, when they are loaded. The frames it
        holds are counted too: an intact gzip with fewer than its header says would fail a job mid-way."""
        st = os.stat(self.path)
        key = (str(self.path), st.st_size, st.st_mtime_ns, ("gzip",))
        if key in _VERIFIED:
            return
        total = 0
        try:
            with gzip.open(self.path, "rb") as f:
                while block := f.read(VERIFY_BLOCK):
                    total += len(block)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile (a CRC or length mismatch) is an OSError
            raise SaliencyInputError(f"{self.path} is corrupt ({e}); nothing was explained: copy or download the "
                                     "file again (its bytes do not match the checksum gzip stores)") from None
        held = (total - self._offset) // self._row
        if held < self._shape[0]:
            raise SaliencyInputError(f"{self.path} is truncated: its header says {self._shape[0]} frames but it holds "
                                     f"{held}; nothing was explained: {CRAFTED}")
        extra = total - self._offset - self._shape[0] * self._row
        if extra:
            raise SaliencyInputError(f"{self.path}: {extra} bytes after the {self._shape[0]} frames its header "
                                     f"declares; nothing was explained: {CRAFTED}")
        _VERIFIED[key] = True

    def fingerprint(self) -> str:
        return _fingerprint_files([p for p in (self.path, self.terminal_path, self.add_count_path,
                                               self.invalid_path, self.episode_end_path) if Path(p).exists()])


class DopamineSource(ConcatSource):
    """A DQN Replay Dataset / Dopamine replay directory: every observation checkpoint, K ascending."""

    def __init__(self, path: Path, files: list[Path]):
        parts = []
        for f in files:
            k = DOPAMINE_OBS.match(f.name).group(1)
            parts.append(DopamineCheckpoint(f, f.parent / f"$store$_terminal_ckpt.{k}.gz"))
        super().__init__(path, parts)

    def row_ids(self, start: int, stop: int) -> dict:
        parts = self._gather(start, stop, lambda part, lo, hi: part.row_ids(lo, hi))
        return {k: np.concatenate([p[k] for p in parts]).astype(np.int64) for k in ("index", "checkpoint")}

    def describe(self) -> dict:
        return {"kind": "dopamine", "path": self.path, "checkpoints": len(self.parts),
                "order": "Dopamine's valid transitions (is_valid_transition), oldest first"}


def row_ids(source, start: int, stop: int) -> dict:
    """What identifies states [start, stop) in the input: {"index": ...} (the row number, or a
    Dopamine buffer's index) plus, for Dopamine input, {"checkpoint": ...} (its K)."""
    if hasattr(source, "row_ids"):
        return source.row_ids(start, stop)
    return {"index": np.arange(start, stop, dtype=np.int64)}


def open_source(path) -> "ArraySource | NpzSource | ConcatSource":
    """Open an input buffer by path: .npy, .npz (key `obs`, optionally `actions`), a shard
    directory, or a Dopamine dir."""
    p = Path(path)
    if not p.exists():
        raise SaliencyInputError(f"input {path} does not exist")
    if p.is_dir():
        names = sorted(os.listdir(p))
        dop = sorted((n for n in names if DOPAMINE_OBS.match(n)), key=lambda n: int(DOPAMINE_OBS.match(n).group(1)))
        if dop:
            return DopamineSource(p, [p / n for n in dop])
        shards = [n for n in names if n.endswith((".npy", ".npz"))]
        folder = next((n for n in shards if (p / n).is_dir()), None)
        if folder is not None:  # read as a nested shard folder, a link to its own folder looped until ELOOP
            raise SaliencyInputError(f"input directory {path}: {folder} is a folder, not a shard file; a shard "
                                     "folder holds .npy/.npz files only, so move or rename it")
        if not shards:
            raise SaliencyInputError(
                f"input directory {path} holds no .npy/.npz shards and no Dopamine "
                "'$store$_observation_ckpt.K.gz' files")
        return ConcatSource(p, [open_source(p / n) for n in shards])
    if p.suffix == ".npy":
        return _open_npy(p)
    if p.suffix == ".npz":
        return NpzSource(p)
    raise SaliencyInputError(f"input {path}: unsupported file type; use .npy, .npz (key 'obs'), "
                             "a directory of shards, or a Dopamine replay directory")
