"""Every relative link and picture of the README and the documentation resolves to a file in the
repository checkout, so it works on GitHub as well as on the site (whose hook maps links to the files
it brings in from outside docs/ onto their places in the site: docs/_build/hooks.py). Fast: no build."""
import importlib.util
import re
from pathlib import Path

import pytest

from tests._support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
TARGETS = [re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)"),   # [text](target "title")
           re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)"),               # [ref]: target
           re.compile(r"""<(?:img|a|source)\b[^>]*\b(?:src|href)=["']([^"']+)["']""")]
# the methods' picture lines, which the per-method pictures (docs/_build/method_pictures.py) replace;
# they resolve on the site only


def links(text: str):
    """(line number, target) of every link and picture outside fenced code and inline code."""
    in_fence = False
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for pattern in TARGETS:
            for target in pattern.findall(line):
                yield no, target


def broken(page: Path, text: str | None = None) -> list[str]:
    """`page:line: target` for each relative link of the page (its text, unless given) that names no file."""
    rel = page.relative_to(ROOT).as_posix()
    out = []
    for no, target in links(page.read_text() if text is None else text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # another site, or a section of this page
        path = target.split("#")[0].split("?")[0]
        resolved = (page.parent / path).resolve()
        if path.startswith("/") or not resolved.is_relative_to(ROOT) or not resolved.exists():
            out.append(f"{rel}:{no}: {target}")
    return out


def test_link_finder_sees_every_kind_of_link():
    text = ('[a](x.md) ![b](../y.png "t") [c](z.md#s) `[d](code.md)` <img src="w.png">\n'
            '[ref]: v.md\n```\n[e](fenced.md)\n```\n[f](#here)\n')
    assert [t for _, t in links(text)] == ["x.md", "../y.png", "z.md#s", "w.png", "v.md", "#here"]


def test_a_missing_file_and_a_site_only_path_are_reported():
    text = "[x](no_such_page.md) [y](index.md) [z](/index.md)\n![w](experiments/results/demo/breakout_grid.png)"
    assert broken(ROOT / "docs" / "probe.md", text) == [
        "docs/probe.md:1: no_such_page.md", "docs/probe.md:1: /index.md",
        "docs/probe.md:2: experiments/results/demo/breakout_grid.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_in_the_repository(page):
    assert not broken(page), broken(page)


@pytest.mark.slow  # needs the docs extra, which `make test-slow` installs (CI runs it there)
def test_the_site_hook_maps_repository_links_onto_the_site():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "_build" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    fig = "experiments/results/demo/breakout_grid.png"
    assert hooks.site_link(f"../{fig}", "index.md") == fig
    assert hooks.site_link("../../notebooks/quickstart.ipynb", "guides/batch.md") == "../notebooks/quickstart.ipynb"
    assert hooks.site_link("../methods/gradcam.md", "guides/batch.md") == "../methods/gradcam.md"  # inside docs/
    assert hooks.site_link("../pyproject.toml", "index.md") == "../pyproject.toml"  # not brought in: unchanged
    md = f"![hero](../{fig})\n```\n![x](../{fig})\n```\n"
    assert hooks.rewrite_links(md, "index.md") == f"![hero]({fig})\n```\n![x](../{fig})\n```\n"
