"""The shipped agents' weight files: where each is found, and fetching the ones an install lacks.

`shipped/manifest.json` lists every shipped agent's file with its size and sha256. A checkout (and an
editable install of it) has all the files in `shipped/`; the wheel carries only the demo agent's
(`breakout`) and the cards, and `jaxsal agents fetch NAME --from DIR_OR_URL` copies the others into the
user's cache (JAXSAL_CACHE_DIR, else $XDG_CACHE_HOME/jaxsal, else ~/.cache/jaxsal), checked against the
manifest before it is kept. The project publishes no release address yet, so the source is always given.

    python -m jaxsal_agents.weights          # rewrite the manifest after exporting or adopting an agent
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .errors import AgentLoadError

# resolved: a strict editable install links each file, and the links lead back to the checkout's folder
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
MANIFEST = "manifest.json"
CACHE_ENV = "JAXSAL_CACHE_DIR"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_CHUNK = 1 << 20


def manifest(folder: Path | None = None) -> dict[str, dict]:
    """{name: {"file", "bytes", "sha256"}} of every shipped agent, from `folder` (default: the shipped
    agents' folder)/manifest.json."""
    folder = SHIPPED_DIR if folder is None else folder
    try:
        entries = json.loads((Path(folder) / MANIFEST).read_text())["agents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AgentLoadError(f"cannot read the shipped agents' manifest {Path(folder) / MANIFEST} ({e}); "
                             "reinstall jaxsal") from None
    return {e["name"]: e for e in entries}


def cache_dir() -> Path:
    """Where fetched weights go: JAXSAL_CACHE_DIR, else $XDG_CACHE_HOME/jaxsal, else ~/.cache/jaxsal (+ /agents)."""
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxsal"
    return Path(root) / "agents"


def _entry(name: str) -> dict:
    entries = manifest()
    if name not in entries:
        raise AgentLoadError(f"unknown agent {name!r}; shipped agents: {', '.join(sorted(entries)) or 'none'}")
    return entries[name]


def find(name: str) -> Path | None:
    """The weight file of shipped agent `name` where this install has it (its package folder or the
    cache), else None."""
    file = _entry(name)["file"]
    return next((p for p in (SHIPPED_DIR / file, cache_dir() / file) if p.is_file()), None)


def require(name: str) -> Path:
    """The weight file of shipped agent `name`; where it is missing, one error naming the command that fetches it."""
    path = find(name)
    if path is None:
        e = _entry(name)
        raise AgentLoadError(f"the weights of agent {name!r} ({e['file']}, {e['bytes'] / 1e6:.1f} MB) are not "
                             f"installed (the wheel carries only the demo agent's); fetch them: `jaxsal agents fetch "
                             f"{name} --from DIR_OR_URL`, the folder of a jaxsal checkout's agents/shipped or its URL")
    return path


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _open(source: str, file: str):
    """A binary stream of `file` from a folder or a URL of one."""
    if _URL.match(source):
        url = source.rstrip("/") + "/" + urllib.parse.quote(file)
        try:
            return urllib.request.urlopen(url, timeout=60), url
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise AgentLoadError(f"cannot download {url} ({getattr(e, 'reason', e)}); check --from") from None
    folder = Path(source).expanduser()
    if not folder.is_dir():
        raise AgentLoadError(f"--from {source}: no such folder; give the folder that holds {file} (a jaxsal "
                             "checkout's agents/shipped) or its URL")
    path = folder / file
    if not path.is_file():
        raise AgentLoadError(f"--from {source}: it holds no {file}; give the folder of the shipped agents' files")
    return open(path, "rb"), str(path)


def fetch(name: str, source: str) -> tuple[Path, bool]:
    """Copy or download shipped agent `name`'s weights from `source` (a folder or a URL of one) into the
    cache, kept only when size and sha256 equal the manifest's (written to a temporary file, checked,
    then renamed: never a partial file). Returns (path, fetched): fetched False when the install has them.

    Raises:
        AgentLoadError: an unknown name, a source without the file, or a file other than the manifest's.
    """
    want = _entry(name)
    have = find(name)
    if have is not None and (have.parent == SHIPPED_DIR or sha256_file(have) == want["sha256"]):
        return have, False
    dest = cache_dir() / want["file"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    stream, where = _open(source, want["file"])
    fd, tmp = tempfile.mkstemp(prefix=f".{want['file']}.", suffix=".part", dir=dest.parent)
    try:
        h, size = hashlib.sha256(), 0
        with stream, os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                size += len(chunk)
                if size > want["bytes"]:
                    break
                h.update(chunk)
                out.write(chunk)
        if size != want["bytes"] or h.hexdigest() != want["sha256"]:
            got = "more" if size > want["bytes"] else f"{size:,}"
            raise AgentLoadError(f"{where} is not agent {name!r}'s weights ({got} bytes, sha256 "
                                 f"{h.hexdigest()[:12]}...; the manifest says {want['bytes']:,} bytes, sha256 "
                                 f"{want['sha256'][:12]}...); nothing was written, check --from")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest, True


def write_manifest(folder: Path | None = None) -> Path:
    """Rewrite `folder`/manifest.json (default: the shipped agents') from its cards and weight files: a
    maintainer's step after exporting or adopting an agent (tests/agents/test_weights.py checks it is current)."""
    folder = Path(SHIPPED_DIR if folder is None else folder)
    weights = [card.with_suffix(".msgpack") for card in sorted(folder.glob("*.json")) if card.name != MANIFEST]
    entries = [{"name": w.stem, "file": w.name, "bytes": w.stat().st_size, "sha256": sha256_file(w)} for w in weights]
    path = folder / MANIFEST
    path.write_text(json.dumps({"agents": entries}, indent=1) + "\n")
    return path


def refresh_manifest(folder) -> None:
    """Rewrite `folder`'s manifest where it has one (a shipped-agents folder), after a weight file changed there."""
    if (Path(folder) / MANIFEST).is_file():
        write_manifest(folder)


if __name__ == "__main__":
    print(write_manifest())
