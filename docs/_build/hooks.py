"""MkDocs hooks: bring files that live elsewhere in the repository into the site, unchanged.

- notebooks/*.ipynb become pages at notebooks/<name>/ (mkdocs-jupyter renders their
  committed outputs; nothing is executed);
- the study reports (experiments/**/*.md: the index, each study's README and registrations, and
  every results folder's reports) with their figures and the small files they link to become
  pages and files under experiments/..., so the reproduction pages link to the very files the
  studies write, and a figure shown in the docs is the committed one. Which files: site_files.py.

Each file keeps its path in the repository. A page links to another file by its path relative to
the page in the repository (`../experiments/results/...` from docs/agents.md, `../../../docs/agents.md`
from a study's results README), so that the link works on GitHub too; `on_page_markdown` rewrites
each such link to the file's place in the site.

The reports are written for GitHub's Markdown, where a list may follow a paragraph line directly;
`GitHubLists` (added to every page's Markdown) gives such a list the blank line Python-Markdown
needs. Lists nested by 2 spaces are mdx_truly_sane_lists' job (mkdocs.yml).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

# the rules live in site_files.py (no MkDocs import: the fast tests use them too)
_spec = importlib.util.spec_from_file_location("jaxsal_docs_site_files", Path(__file__).with_name("site_files.py"))
site_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_files)
ROOT, DOCS, FENCE, BROUGHT_IN = site_files.ROOT, site_files.DOCS, site_files.FENCE, site_files.BROUGHT_IN
site_link, rewrite_links = site_files.site_link, site_files.rewrite_links


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
    for dest in sorted(BROUGHT_IN):  # the walk site_files did once, at import
        # a real File rooted at the repository (not File.generated): mkdocs-jupyter wraps it
        files.append(File(dest.as_posix(), src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown, page, config, files):
    src = Path(page.file.abs_src_path).resolve()
    if src.suffix != ".md":          # a notebook's page: its links are left as they are
        return markdown
    return rewrite_links(markdown, src.relative_to(ROOT).as_posix())
