"""Which files from outside docs/ the site brings in, and where a link lands in the site.

Plain Python (no MkDocs import), so the fast tests check the same rules the site's hook
(`hooks.py`) builds with:

- notebooks/*.ipynb;
- the study reports: every experiments/**/*.md, and everything small in a study's results
  folder (any experiments/**/results/, with its figures and tables);
- the small files a brought-in report links to (a study's script, a provenance record), so that
  a report's links work in the site as they do on GitHub.

Each file keeps its repository path in the site; a page of docs/ sits at its path inside docs/.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# studies' run folders hold thousands of small arrays; fragments written for pasting elsewhere are not pages
SKIP_PARTS = ("runs_minatar", "runs_atari")
SKIP_NAMES = ("README_section.md", "against_peers_README_section.md")
RESULT_SUFFIXES = (".md", ".png", ".json", ".csv")
LINKED_SUFFIXES = RESULT_SUFFIXES + (".py",)
MAX_BYTES = 2_000_000

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)")  # [text](target or ![alt](target, up to a #fragment
SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:")


def _small(p: Path, rel: Path, suffixes) -> bool:
    return (p.is_file() and p.suffix in suffixes and p.name not in SKIP_NAMES
            and not set(SKIP_PARTS) & set(rel.parts) and p.stat().st_size <= MAX_BYTES)


def _outside_fences(markdown: str):
    """(is prose, text) pieces of the page: fenced code blocks apart from the rest, so that a link
    whose text wraps onto the next line is still one link."""
    piece, in_fence = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            if piece:
                yield not in_fence, "".join(piece)
            piece, in_fence = [line], not in_fence
            if not in_fence:                       # the closing fence belongs to the code
                yield False, line
                piece = []
        else:
            piece.append(line)
    if piece:
        yield not in_fence, "".join(piece)


def link_targets(markdown: str):
    """Every inline link's and picture's target outside fenced and inline code, without its #fragment."""
    for prose, text in _outside_fences(markdown):
        if prose:
            yield from (m[2] for m in LINK.finditer(re.sub(r"`[^`]*`", "", text)))


def repo_files():
    """(absolute path, path relative to the repository) of every file the site brings in."""
    yield from ((p, p.relative_to(ROOT)) for p in sorted((ROOT / "notebooks").glob("*.ipynb")))
    seen = set()
    experiments = ROOT / "experiments"
    for p in sorted(experiments.rglob("*")):
        rel = p.relative_to(ROOT)
        if p.suffix == ".md" and _small(p, rel, (".md",)) or ("results" in rel.parts
                                                              and _small(p, rel, RESULT_SUFFIXES)):
            seen.add(rel)
            yield p, rel
    for page in sorted(r for r in seen if r.suffix == ".md"):       # what the reports link to
        for target in link_targets((ROOT / page).read_text()):
            if SCHEME.match(target) or target.startswith("/"):
                continue
            p = (ROOT / page.parent / target).resolve()
            if not p.is_relative_to(experiments):
                continue
            rel = p.relative_to(ROOT)
            if rel not in seen and _small(p, rel, LINKED_SUFFIXES):
                seen.add(rel)
                yield p, rel


BROUGHT_IN = frozenset(rel for _, rel in repo_files())


def site_path(rel: Path) -> str | None:
    """Where the repository file `rel` sits in the site's source tree, or None if the site lacks it."""
    if DOCS.relative_to(ROOT) in rel.parents:
        return rel.relative_to(DOCS.relative_to(ROOT)).as_posix()
    return rel.as_posix() if rel in BROUGHT_IN else None


def site_link(target: str, page: str) -> str:
    """The link `target`, written on the page at repository path `page` (docs/index.md,
    experiments/x/README.md) as a path in the repository, as the site sees it: relative to the
    page's place in the site. A link to another site, to a folder or to a file the site lacks is
    returned unchanged."""
    if SCHEME.match(target) or target.startswith("/"):
        return target
    repo = (ROOT / posixpath.dirname(page) / target).resolve()
    if not repo.is_file() or not repo.is_relative_to(ROOT):
        return target
    to, here = site_path(repo.relative_to(ROOT)), site_path(Path(page))
    if to is None or here is None:
        return target
    return posixpath.relpath(to, posixpath.dirname(here) or ".")


def rewrite_links(markdown: str, page: str) -> str:
    """`site_link` applied to every inline link and picture outside fenced code blocks."""
    return "".join(LINK.sub(lambda m: m[1] + site_link(m[2], page), text) if prose else text
                   for prose, text in _outside_fences(markdown))
