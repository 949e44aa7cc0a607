"""Packaging: one version source (jaxsal.__version__) shown by `jaxsal --version` and in the
installed metadata and CITATION.cff; the LICENSE the metadata declares is there."""
import re
import subprocess
import sys
from importlib.metadata import metadata, version

import jaxsal
from tests._support import ROOT


def test_one_version_everywhere():
    out = subprocess.run([sys.executable, "-m", "jaxsal.cli", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"jaxsal {jaxsal.__version__}"
    assert version("jaxsal") == jaxsal.__version__
    assert f'version: "{jaxsal.__version__}"' in (ROOT / "CITATION.cff").read_text()
    assert 'version = "' not in (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]


def test_license_file_matches_the_declared_license():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    md = metadata("jaxsal")
    assert "MIT" in (md.get("License-Expression") or md.get("License") or "")


def test_the_front_pages_count_the_registered_methods():
    import jaxsal

    n = len(jaxsal.registry.SHIPPED)  # not the methods tests register
    for page in ("README.md", "docs/index.md"):
        counts = re.findall(r"\b(\d+) methods\b", (ROOT / page).read_text())
        assert counts and all(int(c) == n for c in counts), (page, counts, n)


def test_the_changelog_names_the_version_a_build_carries():
    """The newest CHANGELOG section is the version a wheel built now carries: "Unreleased" only while
    that version is a development one (so a release never ships an "Unreleased" section), its own
    number once released; the section below it is an earlier release."""
    import jaxsal

    heads = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    v = jaxsal.__version__
    assert heads[0] == (f"Unreleased ({v})" if ".dev" in v else v), (heads[0], v)
    assert all("Unreleased" not in h for h in heads[1:]), heads
