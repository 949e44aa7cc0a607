"""Generated blocks of the docs pages: the text between two marker comments, rewritten from a results file."""
from __future__ import annotations

from pathlib import Path


def replace_block(page: Path, begin: str, end: str, body: str) -> str:
    """`page`'s text with what lies between the lines `begin` and `end` replaced by `body`."""
    text = Path(page).read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page} has no generated-table markers ({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
