"""The loaders' one error type and file read (missing or unreadable file -> one clear line)."""
from __future__ import annotations

from pathlib import Path

from jaxsal.errors import SaliencyInputError


class LoaderError(SaliencyInputError):
    """A checkpoint that is missing, unreadable or not in the expected format."""


def read_bytes(path) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise LoaderError(f"agent file {path} does not exist")
    try:
        return p.read_bytes()
    except OSError as e:
        raise LoaderError(f"cannot read {path}: {e.strerror}") from None
