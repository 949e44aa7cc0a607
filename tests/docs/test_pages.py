"""The README and the documentation pages agree with the code: every method has a page that lists its
options with their defaults, the README's method table links every page, the README opens with the two
set-up commands, and its links and pictures stay inside the repository and exist. Fast: no build
(tests/docs/test_build.py builds the site, slow)."""
import re

import pytest

import jaxsal
from tests._support import ROOT

README = (ROOT / "README.md").read_text()
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _fmt(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_the_readme_opens_with_the_two_set_up_commands():
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("make demo ") and first_block[1].startswith("make test "), first_block


@pytest.mark.parametrize("method", [m for m in jaxsal.methods()
                                    if jaxsal.METHODS[m].__module__.startswith("jaxsal.")])  # not tests' stand-ins
def test_every_method_has_a_page_with_its_options_and_defaults(method):
    page = ROOT / "docs" / "methods" / f"{method}.md"
    assert page.is_file(), f"docs/methods/{method}.md is missing"
    text = page.read_text()
    missing = [f"{name}={value!r}" for name, value in jaxsal.method_options(method).items()
               if f"| `{name}` | `{_fmt(value)}` |" not in text]
    assert not missing, f"docs/methods/{method}.md: options table lacks {missing}"
    assert f"methods/{method}.md" in (ROOT / "mkdocs.yml").read_text(), "not in the site's navigation"
    assert f"](docs/methods/{method}.md)" in README, "the README's method table does not link it"
    assert f"](../api/methods.md#jaxsal.{method})" in text, "no link to its API entry"


def test_the_readmes_method_table_counts_and_defaults_are_the_codes():
    """The README's method count and families, and each `name=value` of its key-options column, are
    the registry's (a changed default or a new method makes the README stale)."""
    ours = sorted(jaxsal.registry.SHIPPED)
    rows = {m: cells.split(" | ") for m, cells in re.findall(r"^\| \[`(\w+)`\]\([^)]+\) \| (.+) \|$", README, re.M)}
    assert sorted(rows) == sorted(ours)
    families = {cells[0] for cells in rows.values()}
    words = {3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"It has {len(ours)} methods in {words[len(families)]} families" in README.replace("\n", " "), families
    assert f"All {len(ours)} methods" in README
    for m, cells in rows.items():
        for name, value in re.findall(r"`(\w+)=([^`]+)`", cells[-1]):
            assert _fmt(jaxsal.method_options(m)[name]) == value or repr(jaxsal.method_options(m)[name]) == value, \
                (m, name, value, jaxsal.method_options(m)[name])


def test_the_readmes_links_and_pictures_exist_inside_the_repository():
    bad = []
    for target in LINK.findall(README):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            bad.append(f"{target}: the README links only into the repository")
            continue
        path = (ROOT / target.split("#")[0]).resolve()
        if ROOT not in path.parents and path != ROOT or not path.exists():
            bad.append(target)
    assert not bad, bad
    assert any(t.endswith(".png") for t in LINK.findall(README)), "the README shows a committed picture"


def test_no_page_links_outside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{p.relative_to(ROOT)}: {t}" for p in pages for t in LINK.findall(p.read_text())
           if "shared/" in t or t.startswith("/")]
    assert not bad, bad
