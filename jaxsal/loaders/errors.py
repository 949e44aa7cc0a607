"""The loaders' one error type and file reads (missing, unreadable or oversized -> one clear line)."""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

from jaxsal.errors import SaliencyInputError, brief


class LoaderError(SaliencyInputError):
    """A checkpoint that is missing, unreadable or not in the expected format."""


def read_bytes(path) -> bytes:
    """The bytes of an agent file; a directory or an empty file is named as such (else an empty file
    reads as some other format, and a directory as a missing file)."""
    p = Path(path)
    if p.is_dir():
        raise LoaderError(f"agent file {path} is a directory, give the checkpoint file inside it")
    if not p.is_file():  # reading a FIFO or a device would block or never end
        why = ("is a symbolic link to nothing (a loop of links or a missing target)" if p.is_symlink() and not p.exists()
               else "is not a regular file (a pipe, socket or device)" if p.exists() else "does not exist")
        raise LoaderError(f"agent file {path} {why}; give the checkpoint file itself")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise LoaderError(f"cannot read {path}: {e.strerror}") from None
    if not data:
        raise LoaderError(f"agent file {path} is empty (0 bytes): the copy or download was cut off, get it again "
                          "from where it was made")
    return data


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


def check_params(path, params, expected, network: str):
    """`params` as read from `path` against `expected` (the network's init, or its jax.eval_shape):
    the same names and shapes, floating point where the network's are, finite; else a LoaderError
    naming the first difference, so a file of another network never loads as a silently different one."""
    import jax.numpy as jnp
    import numpy as np

    from jaxsal.checks import first_nonfinite_leaf, named_leaves

    fix = f"is it a checkpoint of {network}? get it again from where it was made"
    want = named_leaves(expected)
    got = named_leaves(params, lambda e: LoaderError(f"{path}: its parameter tree cannot be read ({brief(e)}): its "
                                                     f"names are not all strings; {fix}"))
    for keys, which in ((set(want) - set(got), "no parameter {}, which {} has"),
                        (set(got) - set(want), "a parameter {}, which {} does not have")):
        if keys:
            raise LoaderError(f"{path}: {which.format(sorted(keys)[0], network)}; {fix}")
    for k, w in want.items():
        v = got[k]
        dtype = getattr(v, "dtype", None)
        if not hasattr(v, "shape") or dtype is None or not (jnp.issubdtype(dtype, jnp.floating)
                                                             or jnp.issubdtype(dtype, jnp.integer)
                                                             or dtype == bool):
            raise LoaderError(f"{path}: parameter {k} is {type(v).__name__} {dtype}, not an array of "
                              f"real numbers; {fix}")
        if tuple(v.shape) != tuple(w.shape):
            raise LoaderError(f"{path}: parameter {k} has shape {tuple(v.shape)}, {network} wants "
                              f"{tuple(w.shape)}; {fix}")
        if jnp.issubdtype(w.dtype, jnp.floating) and not jnp.issubdtype(dtype, jnp.floating):
            raise LoaderError(f"{path}: parameter {k} has dtype {dtype}, not floating point; {fix}")
        if np.dtype(dtype).itemsize > 8:  # float128: no JAX array type
            raise LoaderError(f"{path}: parameter {k} has dtype {dtype}, which JAX cannot compute in; {fix}")
    k = first_nonfinite_leaf(got.items())
    if k is not None:
        raise LoaderError(f"{path}: parameter {k} holds NaN or infinite values, or values beyond float32's range "
                          "(the training diverged or the file is corrupt): use an earlier checkpoint of the run")
