"""Errors for bad user input to jaxsal (a clear message, never a deep traceback), and the one line
a command prints for any error."""


class SaliencyInputError(ValueError):
    """Bad observation, target, method, layer or option given to a saliency method."""


class CLIError(Exception):
    """A user error found by the command line itself (a flag, a path, an agent spec)."""


def is_user_error(e: BaseException) -> bool:
    """Whether `e` is the user's to fix (exit 2), not jaxsal's (exit 1); provider errors: jaxsal.plugins."""
    return isinstance(e, (CLIError, SaliencyInputError, OSError))


def brief(e: BaseException) -> str:
    """"Type: first line of its message": an exception named in one line of a message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def name_fault(name: str) -> str | None:
    """What keeps `name` from naming a thing on one line (a message, a summary, a table column): empty, only
    whitespace, or holding a line break or another character that is not printed; None when nothing does."""
    if not name.strip():
        return "is empty" if not name else "is only whitespace"
    bad = next((c for c in name if not c.isprintable()), None)
    return None if bad is None else f"holds {bad!r} (a line break or another character that is not printed)"


def one_line(text: str) -> str:
    """`text` with each character that is not printed written as its escape (a newline as \\n): a path or spec
    quoted in a one-line message."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error_line(e: BaseException, job: bool = True) -> str:
    """The one line a command prints (or a sweep cell records) for an error; `job`: the command is a
    resumable job (explain, sweep, demo), whose finished chunks a rerun resumes (else, e.g. render,
    that advice is left out)."""
    import errno

    if isinstance(e, OSError):
        what = e.strerror or str(e)
        where = f" ({e.filename})" if e.filename else ""
        hint = {errno.ENOSPC: "free some space there or choose another --out",
                errno.EACCES: "choose a writable --out", errno.EROFS: "choose a writable --out"}.get(
            e.errno, "check the path")
        resume = "; finished chunks are kept, rerun the same command to resume" if job else ""
        return f"{what}{where}: {hint}{resume}"
    if is_user_error(e):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"internal error {brief(e)} (set JAXSAL_DEBUG=1 for the traceback)"
