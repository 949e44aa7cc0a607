"""Every relative link and picture of the README and the documentation resolves to a file in the
repository checkout, so it works on GitHub as well as on the site (whose hook maps links to the files
it brings in from outside docs/ onto their places in the site: docs/_build/hooks.py). Fast: no build."""
import importlib.util
import re
from pathlib import Path

import pytest

from tests._support import ROOT


def _site_files():
    spec = importlib.util.spec_from_file_location("docs_site_files", ROOT / "docs" / "_build" / "site_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


site_files = _site_files()
DOCS_PAGES = sorted((ROOT / "docs").rglob("*.md"))
STUDY_PAGES = [ROOT / rel for rel in sorted(site_files.BROUGHT_IN) if rel.suffix == ".md"]
PAGES = [ROOT / "README.md", *DOCS_PAGES, *STUDY_PAGES]
FENCE = re.compile(r"^\s*(```|~~~)")
TARGETS = [re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)"),   # [text](target "title")
           re.compile(r"^[ \t]*\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:\s|$)", re.M),               # [ref]: target
           re.compile(r"""<(?:img|a|source)\b[^>]*\b(?:src|href)=["']([^"']+)["']""")]


def links(text: str):
    """(line number, target) of every link and picture outside fenced code and inline code; a link
    whose text wraps onto the next line counts, at the line where it starts."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            line = ""
        lines.append("" if in_fence else re.sub(r"`[^`]*`", "", line))
    prose = "\n".join(lines)
    found = sorted((m.start(), m[1]) for pattern in TARGETS for m in pattern.finditer(prose))
    for start, target in found:
        yield prose.count("\n", 0, start) + 1, target


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
    assert list(links("one\n[wrapped\nlink](x.md) and [b](y.md)\n")) == [(2, "x.md"), (3, "y.md")]


def test_a_missing_file_and_a_site_only_path_are_reported():
    text = "[x](no_such_page.md) [y](index.md) [z](/index.md)\n![w](experiments/results/demo/breakout_grid.png)"
    assert broken(ROOT / "docs" / "probe.md", text) == [
        "docs/probe.md:1: no_such_page.md", "docs/probe.md:1: /index.md",
        "docs/probe.md:2: experiments/results/demo/breakout_grid.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_in_the_repository(page):
    assert not broken(page), broken(page)


def lands_nowhere(page: Path, text: str | None = None) -> list[str]:
    """`page:line: target` for each link of a site page (its text, unless given) to a repository file
    that the site does not have (the strict build refuses those: "not found among documentation files"),
    or to a folder (the site has no page for one)."""
    rel = page.relative_to(ROOT).as_posix()
    out = []
    for no, target in links(page.read_text() if text is None else text):
        path = target.split("#")[0].split("?")[0]
        if not path or re.match(r"[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
            continue
        resolved = (page.parent / path).resolve()
        if resolved.is_dir() or resolved.is_file() and resolved.is_relative_to(ROOT) and \
                site_files.site_path(resolved.relative_to(ROOT)) is None:
            out.append(f"{rel}:{no}: {target}")
    return out


def test_a_link_to_a_file_the_site_lacks_is_reported():
    text = "[a](../pyproject.toml) [b](index.md) [c](../experiments/README.md) [d](../jaxsal/)"
    assert lands_nowhere(ROOT / "docs" / "probe.md", text) == ["docs/probe.md:1: ../pyproject.toml",
                                                              "docs/probe.md:1: ../jaxsal/"]


@pytest.mark.parametrize("page", [*DOCS_PAGES, *STUDY_PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_of_a_site_page_lands_on_a_file_of_the_site(page):
    assert not lands_nowhere(page), lands_nowhere(page)


def test_a_study_report_links_to_the_docs_and_its_scripts_in_the_site():
    page = "experiments/counterfactual/results/README.md"
    assert site_files.site_link("../../../docs/agents.md", page) == "../../../agents.md"
    assert site_files.site_link("../report.py", page) == "../report.py"
    assert Path("experiments/counterfactual/report.py") in site_files.BROUGHT_IN
    assert site_files.site_link("../../../pyproject.toml", page) == "../../../pyproject.toml"  # not brought in


@pytest.mark.slow  # needs the docs extra, which `make test-slow` installs (CI runs it there)
def test_the_site_hook_maps_repository_links_onto_the_site():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "_build" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    fig = "experiments/results/demo/breakout_grid.png"
    assert hooks.site_link(f"../{fig}", "docs/index.md") == fig
    assert hooks.site_link("../../notebooks/quickstart.ipynb", "docs/guides/batch.md") == "../notebooks/quickstart.ipynb"
    assert hooks.site_link("../methods/gradcam.md", "docs/guides/batch.md") == "../methods/gradcam.md"  # inside docs/
    assert hooks.site_link("../pyproject.toml", "docs/index.md") == "../pyproject.toml"  # not brought in: unchanged
    md = f"![hero](../{fig})\n```\n![x](../{fig})\n```\n[a\nwrapped link](../{fig})\n"
    assert hooks.rewrite_links(md, "docs/index.md") == f"![hero]({fig})\n```\n![x](../{fig})\n```\n[a\nwrapped link]({fig})\n"
