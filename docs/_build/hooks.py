"""MkDocs hooks: bring files that live elsewhere in the repository into the site, unchanged.

- notebooks/*.ipynb become pages at notebooks/<name>/ (mkdocs-jupyter renders their
  committed outputs; nothing is executed);
- the study reports (experiments/**/*.md: the index, each study's README and registrations, and
  experiments/results/**/*.md) and their figures and the small files they link to become pages
  and files under experiments/..., so the reproduction pages link to the very files the studies
  write, and a figure shown in the docs is the committed one.

Each file keeps its path in the repository. A page in docs/ links to such a file by its path relative
to the page in the repository (`../experiments/results/...` from docs/agents.md), so that the link works
on GitHub too; `on_page_markdown` rewrites each such link to the file's place in the site.

The reports are written for GitHub's Markdown, where a list may follow a paragraph line directly;
`GitHubLists` (added to every page's Markdown) gives such a list the blank line Python-Markdown
needs. Lists nested by 2 spaces are mdx_truly_sane_lists' job (mkdocs.yml).
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
# studies' run folders hold thousands of small arrays; fragments written for pasting elsewhere are not pages
SKIP_PARTS = ("runs_minatar", "runs_atari")
SKIP_NAMES = ("README_section.md", "against_peers_README_section.md")
RESULT_SUFFIXES = (".md", ".png", ".json", ".csv")
MAX_BYTES = 2_000_000


def _repo_files():
    yield from ((p, p.relative_to(ROOT)) for p in sorted((ROOT / "notebooks").glob("*.ipynb")))
    for p in sorted((ROOT / "experiments").rglob("*.md")):
        if p.relative_to(ROOT).parts[1] != "results":   # experiments/results/: below, with its figures
            yield p, p.relative_to(ROOT)
    for p in sorted((ROOT / "experiments" / "results").rglob("*")):
        rel = p.relative_to(ROOT)
        if (p.is_file() and p.suffix in RESULT_SUFFIXES and p.name not in SKIP_NAMES
                and not set(SKIP_PARTS) & set(rel.parts) and p.stat().st_size <= MAX_BYTES):
            yield p, rel


BROUGHT_IN = frozenset(rel for _, rel in _repo_files())


FENCE = re.compile(r"^\s*(```|~~~)")
DOCS = ROOT / "docs"
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)")  # [text](target or ![alt](target, up to a #fragment


def site_link(target: str, page_src: str) -> str:
    """A repository-relative link from docs/<page_src> to a file outside docs/ that the site brings in
    (`_repo_files`), as the site sees it: relative to the page within the site's tree, where the file
    keeps its repository path. Every other link is returned unchanged."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return target
    repo = (DOCS / posixpath.dirname(page_src) / target).resolve()
    if DOCS in repo.parents or ROOT not in repo.parents or not repo.is_file():
        return target
    rel = repo.relative_to(ROOT)
    if rel not in BROUGHT_IN:
        return target
    return posixpath.relpath(rel.as_posix(), posixpath.dirname(page_src) or ".")


def rewrite_links(markdown: str, page_src: str) -> str:
    """`site_link` applied to every inline link and picture outside fenced code blocks."""
    out, in_fence = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            line = LINK.sub(lambda m: m[1] + site_link(m[2], page_src), line)
        out.append(line)
    return "".join(out)


LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.) \S")  # top-level items only: indented ones may be YAML (::: options)


class _BlankLineBeforeLists(Preprocessor):
    def run(self, lines):
        out, in_list, in_fence = [], False, False
        for line in lines:
            if FENCE.match(line):
                in_fence = not in_fence
            elif not in_fence:
                if not line.strip():
                    in_list = False
                elif LIST_ITEM.match(line):
                    if not in_list and out and out[-1].strip():
                        out.append("")
                    in_list = True
            out.append(line)
        return out


class GitHubLists(Extension):
    def extendMarkdown(self, md):
        # after whitespace normalisation (30), before fenced blocks are stashed (25)
        md.preprocessors.register(_BlankLineBeforeLists(md), "github_lists", 27)


def on_config(config):
    config.markdown_extensions.append(GitHubLists())
    return config


@event_priority(100)  # before mkdocs-jupyter, so that it renders the notebooks added here
def on_files(files, config):
    for src, dest in _repo_files():
        # a real File rooted at the repository (not File.generated): mkdocs-jupyter wraps it
        files.append(File(dest.as_posix(), src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown, page, config, files):
    if Path(page.file.abs_src_path).resolve().is_relative_to(DOCS):
        return rewrite_links(markdown, page.file.src_uri)
    return markdown
