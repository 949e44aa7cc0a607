"""The loaders' one error type and file reads (missing, unreadable or oversized -> one clear line)."""
from __future__ import annotations

import zipfile
import zlib
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


def read_zip_member(z: zipfile.ZipFile, name: str, path, limit: int) -> bytes:
    """Member `name` of an open zip, refused when it declares more than `limit` bytes uncompressed
    (checked before reading); read as one bounded stream, which zipfile stops at the declared size
    and checks against the member's CRC."""
    try:
        info = z.getinfo(name)
        if info.file_size <= limit:
            with z.open(info) as f:
                data = f.read(limit + 1)
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError, zlib.error) as e:
        raise LoaderError(f"cannot read member {name!r} of {path}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''}; the file is corrupt or crafted, "
                          "get it again from where it was made") from None
    if info.file_size > limit or len(data) > limit:
        raise LoaderError(f"{path}: member {name!r} declares {info.file_size} bytes uncompressed, more than the "
                          f"{limit} jaxsal reads from it (a model file holds far less): the file is corrupt or "
                          "crafted, get it again from where it was made")
    return data
