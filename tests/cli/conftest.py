"""Fixtures of the CLI tests."""
import builtins
import errno
import io
import os

import pytest


@pytest.fixture
def read_only(monkeypatch):
    """read_only(DIR): every write, create, rename or delete under DIR fails with EROFS, as on a
    read-only mount (the tests run as root, so chmod would not stop anything)."""
    roots = []

    def under(p):
        if not isinstance(p, (str, bytes, os.PathLike)):
            return False
        q = os.path.abspath(os.fsdecode(p))
        return any(q == r or q.startswith(r + os.sep) for r in roots)

    def deny(p):
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(p))

    real_open = builtins.open

    def guarded_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and under(file):
            deny(file)
        return real_open(file, mode, *a, **k)
    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    real_os_open = os.open

    def guarded_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC) and under(path):
            deny(path)
        return real_os_open(path, flags, *a, **k)
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("mkdir", "replace", "rename", "link", "unlink", "remove", "rmdir", "symlink"):
        real = getattr(os, name)

        def guarded(*a, _real=real, **k):
            if any(under(x) for x in a[:2]):
                deny(a[0])
            return _real(*a, **k)
        monkeypatch.setattr(os, name, guarded)
    return lambda d: roots.append(os.path.abspath(d))
