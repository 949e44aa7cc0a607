"""The Paper B re-run's progress as small files that can be committed, so a game spread over many
short sessions on fresh machines finishes without redoing work.

A game's progress folder (by default `experiments/results/paper_b_rerun/<game>/progress/`) holds:

- `run.json`: the settings every piece depends on (game, agent weights' sha256, sizes, epsilon,
  step cap, seed). A run with other settings refuses the folder rather than mixing pieces.
- `episodes/epNNN.npz`: per episode not its frames but what regenerates them exactly: the env
  seed and the actions taken, with the sha256 of the trajectory (every observation and action)
  and of the kept states. Restoring replays the actions through the same env; a replay whose
  hashes differ stops the run (`ReplayMismatch`), it never continues on other states.
- `methods/<label>.npz`: per method its finished results (fidelity AUCs and curves, each finished
  sanity draw, the timing of its maps), never the maps. The values are kept at the precision the
  outputs write them (`decimals`, 5), as integers (`pack`), which the outputs reproduce byte for
  byte; full float32/float64 mantissas hardly compress (about 250 KB a method instead of 140). Each file carries a key (sha256 of the states, the agent, the method and its options,
  the precision and the settings the results depend on); a file whose key differs from the run's
  is stale and ignored, so its results are recomputed. Beside the results, each piece's `made_by`
  (JSON: git commit, jax, backend and, in pieces made since hosts were recorded, "host": CPU
  model, core counts, XLA_FLAGS, jax and jaxlib) says where it was computed; it is not part of
  any key, so pieces recorded before a field was added stay valid.

The npz files are compressed and read with allow_pickle=False.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from experiments.common.hashing import sha256_array

FORMAT = 1      # bump when the files' layout or meaning changes: older pieces then read as stale


class ProgressMismatch(RuntimeError):
    """A progress folder recorded under other settings than the current run's."""


class ReplayMismatch(RuntimeError):
    """Replaying a recorded episode did not reproduce its recorded states."""


# ------------------------------------------------------------------ npz files
def save_npz(path: Path, compressed: bool = False, **arrays) -> None:
    """np.savez(_compressed) to a temporary file, then an atomic rename: a killed run never leaves
    half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        (np.savez_compressed if compressed else np.savez)(f, **arrays)
    os.replace(tmp, path)


def load_npz(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _equal(a, b) -> bool:
    """Same dtype and values, NaN equal to NaN (a fidelity curve may hold NaN: an unchanged piece
    must read as unchanged, or its made_by would be rewritten as if it were recomputed)."""
    a, b = np.asarray(a), np.asarray(b)
    nan_ok = a.dtype.kind in "fc"
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=nan_ok)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)


def save_if_changed(path: Path, arrays: dict, ignore=()) -> bool:
    """Write `arrays` compressed unless the file already holds the same arrays (apart from the
    keys in `ignore`): an unchanged piece keeps its bytes, so git sees no change."""
    if path.exists():
        old = load_npz(path)
        if _same({k: v for k, v in old.items() if k not in ignore},
                 {k: v for k, v in arrays.items() if k not in ignore}):
            return False
    save_npz(path, compressed=True, **arrays)
    return True


def pack(arrays: dict, decimals: int) -> dict:
    """Named arrays as one npz-ready dict: every finite float array rounded to `decimals` (the
    outputs' precision) and concatenated into one integer vector, z = 2 |round(x, D)| 10**D plus 1
    where the sign is negative (-0.0 too, which a CSV prints), stored as byte planes (deflate packs
    the near-constant high bytes; one stream, not hundreds of small ones); anything else as is
    ("raw:NAME"); the names' order is kept. Checked: `unpack` gives values that print exactly as
    round(x, D) does."""
    out, names, shapes, kept = {}, [], [], []
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind == "f" and np.isfinite(a).all():
            names.append(name)
            shapes.append(list(a.shape))
            kept.extend(round(float(x), decimals) for x in a.flat)
        else:
            out[f"raw:{name}"] = a
    z = np.array([2 * round(abs(v) * 10 ** decimals) + (math.copysign(1.0, v) < 0) for v in kept], np.int64)
    z = z.astype("<i4" if z.max(initial=0) < 2 ** 31 else "<i8")
    out.update({"packed:order": np.array(list(arrays), dtype=str), "packed:names": np.array(names, dtype=str), "packed:shapes": np.array(json.dumps(shapes)),
                "packed:decimals": np.array(decimals),
                "packed:values": np.ascontiguousarray(z.view(np.uint8).reshape(-1, z.itemsize).T)})
    back = unpack(out)
    if [repr(round(float(x), decimals)) for n in names for x in back[n].flat] != list(map(repr, kept)):
        return {f"raw:{k}": np.asarray(v) for k, v in arrays.items()}      # never expected; exact anyway
    return out


def unpack(z: dict) -> dict:
    """pack's inverse: {name: array} in pack's order, the rounded values as float64."""
    out = {k[4:]: v for k, v in z.items() if k.startswith("raw:")}
    if "packed:values" not in z:
        return out
    order = z["packed:order"].tolist()
    planes = np.asarray(z["packed:values"], np.uint8)
    v = np.ascontiguousarray(planes.T).view(f"<i{planes.shape[0]}").ravel().astype(np.int64)
    mag = (v >> 1).astype(np.float64) / 10 ** int(z["packed:decimals"])
    values, start = np.where(v & 1, -mag, mag), 0
    for name, shape in zip(z["packed:names"].tolist(), json.loads(str(z["packed:shapes"]))):
        n = int(np.prod(shape, dtype=np.int64))
        out[name] = values[start:start + n].reshape(shape)
        start += n
    return {k: out[k] for k in order}


# ------------------------------------------------------------------ hashes
def key_of(fields: dict) -> str:
    return hashlib.sha256(json.dumps({"format": FORMAT, **fields}, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ the folder
EPISODE_CHECKS = ("trajectory_sha256", "states_sha256", "length", "return", "truncated", "random_actions",
                  "env_seed")


class Progress:
    """One game's progress folder for one run's settings (`run`: JSON-able fields); root None: off."""

    def __init__(self, root: Path | None, run: dict, made_by: dict | None = None, log=print, decimals: int = 5):
        self.root, self.run, self.log, self.decimals = (Path(root) if root else None), dict(run), log, decimals
        self.run_key = key_of(self.run)
        self.made_by = json.dumps(made_by or {}, sort_keys=True)
        if self.root is None:
            return
        f = self.root / "run.json"
        if f.exists():
            old = json.loads(f.read_text())
            if old.get("run") != json.loads(json.dumps(self.run)) or old.get("format") != FORMAT:
                diff = {k: (old.get("run", {}).get(k), v) for k, v in self.run.items()
                        if old.get("run", {}).get(k) != v}
                raise ProgressMismatch(
                    f"the progress folder {self.root} was recorded with other settings {diff} (recorded, now); "
                    f"run with the recorded settings, or pass --progress with another folder (or --no-progress)")
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps({"format": FORMAT, "run": self.run}, indent=1, sort_keys=True) + "\n")

    # ---------------------------------------------------------------- episodes
    def _episode_file(self, e: int) -> Path:
        return self.root / "episodes" / f"ep{e:03d}.npz"

    def has_episode(self, e: int) -> bool:
        return self.root is not None and self._episode_file(e).exists()

    def save_episode(self, e: int, ep: dict) -> None:
        """Record episode e (a play_episode result with its actions), if not recorded already."""
        if self.root is None:
            return
        n = int(np.max(ep["actions"], initial=0))
        rec = {"run_key": np.array(self.run_key), "made_by": np.array(self.made_by),
               "actions": np.asarray(ep["actions"], np.uint8 if n < 256 else np.int32),
               "states_sha256": np.array(sha256_array(ep["obs"])),
               **{k: np.asarray(ep[k]) for k in EPISODE_CHECKS if k != "states_sha256"}}
        f = self._episode_file(e)
        if f.exists():
            self.check_episode(e, ep)      # never overwrite a recorded episode with another one
            return
        save_if_changed(f, rec)

    def recorded_episode(self, e: int) -> dict:
        z = load_npz(self._episode_file(e))
        if str(z["run_key"]) != self.run_key:
            raise ProgressMismatch(f"{self._episode_file(e)} belongs to another run (its run key differs from "
                                   f"{self.root / 'run.json'}); remove it or pass --progress with another folder")
        return z

    def check_episode(self, e: int, ep: dict) -> None:
        """Raise ReplayMismatch unless `ep` (replayed here, or found in the cache) is the recorded
        episode e: the same trajectory and states hashes, length, return and seed."""
        rec = self.recorded_episode(e)
        got = {**{k: ep[k] for k in EPISODE_CHECKS if k != "states_sha256"}, "states_sha256": sha256_array(ep["obs"])}
        bad = {k: (str(rec[k]), str(np.asarray(got[k]))) for k in EPISODE_CHECKS
               if str(rec[k]) != str(np.asarray(got[k]))}
        if bad:
            what = "; ".join(f"{k}: recorded {a}, here {b}" for k, (a, b) in bad.items())
            raise ReplayMismatch(
                f"episode {e} here differs from the one recorded in {self._episode_file(e)} ({what}). This "
                f"machine does not reproduce the recorded states (another EnvPool or emulator build, or a cache "
                f"from another run), and the run stops rather than continue on other states. Fix: run where the "
                f"replay matches, or start over from an empty progress folder (--progress elsewhere) and --cache.")

    def replay_episode(self, e: int, replay) -> dict:
        """Episode e regenerated by `replay(env_seed, actions)` and checked against its record."""
        rec = self.recorded_episode(e)
        ep = replay(int(rec["env_seed"]), rec["actions"])
        self.check_episode(e, ep)
        return ep

    # ---------------------------------------------------------------- methods
    def _method_file(self, label: str) -> Path:
        return self.root / "methods" / f"{label}.npz"

    def restore_method(self, label: str, key: str, cache_dir: Path) -> list[str]:
        """Copy method `label`'s recorded pieces into its cache folder (those the cache lacks);
        a record under another key is stale: ignored, its results recomputed. Returns the pieces."""
        if self.root is None or not self._method_file(label).exists():
            return []
        z = load_npz(self._method_file(label))
        if str(z.get("key", "")) != key:
            self.log(f"[{label}] recorded progress is stale (its key differs: other states, agent, options or "
                     f"settings); recomputing it")
            return []
        pieces = {}
        for k, v in unpack(z).items():
            piece, _, name = k.partition(":")
            pieces.setdefault(piece, {})[name] = v
        restored = []
        for piece, arrays in pieces.items():
            f = cache_dir / f"{piece}.npz"
            if not f.exists():
                save_npz(f, **arrays)
                restored.append(piece)
        return restored

    def piece_makers(self, label: str, key: str) -> dict:
        """{piece: its made_by record (git commit, jax, backend; host where recorded)} of method
        `label`'s recorded pieces under `key`; {} with the folder off or nothing recorded."""
        if self.root is None or not self._method_file(label).exists():
            return {}
        z = load_npz(self._method_file(label))
        if str(z.get("key", "")) != key:
            return {}
        return {k.partition("/")[2]: json.loads(str(v)) for k, v in z.items() if k.startswith("made_by/")}

    def save_method(self, label: str, key: str, fields: dict, cache_dir: Path) -> None:
        """Record method `label`'s finished cache pieces (timing, fidelity, sanity draws; not the
        maps) under `key`, keeping what an earlier session recorded under the same key."""
        if self.root is None:
            return
        f = self._method_file(label)
        old = load_npz(f) if f.exists() else {}
        if str(old.get("key", "")) != key:
            old = {}
        flat = unpack(old)
        made = {k: v for k, v in old.items() if k.startswith("made_by/")}
        for p in sorted(cache_dir.glob("*.npz")):
            if p.stem == "maps":
                continue
            piece = {f"{p.stem}:{k}": v for k, v in load_npz(p).items()}
            if not _same(unpack(pack(piece, self.decimals)), {k: flat[k] for k in piece if k in flat}):
                made[f"made_by/{p.stem}"] = np.array(self.made_by)      # new here, or recomputed
            flat.update(piece)
        rec = {**pack(flat, self.decimals), **made, "key": np.array(key),
               "key_fields": np.array(json.dumps(fields, sort_keys=True))}
        save_if_changed(f, rec)


def recorded_makers(root: Path) -> dict:
    """{label: {piece: made_by}} of every method file in the progress folder `root` whose key is
    its recorded key fields' and belongs to the folder's run.json, read without the states (the
    analyse-only mode); {} where the folder is absent. A piece's made_by is its git commit, jax,
    backend and, from the commit that added it, the host it ran on ("host"); older pieces lack it."""
    root = Path(root)
    if not (root / "run.json").exists():
        return {}
    run_key = key_of(json.loads((root / "run.json").read_text())["run"])
    out = {}
    for f in sorted((root / "methods").glob("*.npz")):
        z = load_npz(f)
        if "key_fields" not in z:
            continue
        fields = json.loads(str(z["key_fields"]))
        if str(z.get("key", "")) != key_of(fields) or fields.get("run") != run_key:
            continue
        out[f.stem] = {k.partition("/")[2]: json.loads(str(v)) for k, v in z.items() if k.startswith("made_by/")}
    return out
