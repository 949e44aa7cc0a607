"""The documentation site builds with no warnings (`mkdocs build --strict`, as `make docs` runs it).

Slow: it imports jaxsal for the API reference and converts the notebooks (with their committed
outputs, nothing executed). Skipped where the docs extra is not installed (`pip install -e '.[docs]'`;
`make test-slow` installs it). The site is built once per session (tests/conftest.py).
"""
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_site_builds_strict_with_every_page(docs_site):
    assert docs_site.returncode == 0, docs_site.log
    site = docs_site.path
    for page in ("index.html", "methods/gradcam/index.html", "api/jaxsal/index.html",
                 "notebooks/quickstart/index.html", "reproductions/paper_b/index.html",
                 "experiments/results/paper_b/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "jaxsal" / "index.html").read_text()
    assert 'id="jaxsal.explain"' in api, "the API page documents jaxsal.explain under its public name"
    assert 'id="jaxsal.load_maps"' in api and 'id="jaxsal.gradcam"' not in api, "the members listed, and only those"
    methods = (site / "api" / "methods" / "index.html").read_text()
    for name in ("gradcam", "rise", "integrated_gradients"):
        assert f'id="jaxsal.{name}"' in methods, name
    _api_reference_is_readable(site)


def _api_reference_is_readable(site: Path):
    """Long signatures wrap one argument a line (mkdocstrings formats them with ruff), and a
    function's Args, Returns and Raises render as tables."""
    import html
    import re

    page = (site / "api" / "metrics" / "index.html").read_text()
    start = page.index('id="jaxsal.metrics.insertion"')
    entry = page[start:page.index('id="jaxsal.metrics.', start + 40)]
    signature = re.search(r'<div class="doc-signature.*?</code>', entry, re.S)
    assert signature, "insertion has a signature block"
    lines = html.unescape(re.sub(r"<[^>]+>", "", signature.group(0))).splitlines()
    assert len(lines) > 10 and max(map(len, lines)) <= 88, lines
    for section in ("Parameters:", "Returns:", "Raises:"):
        assert section in entry, section
    assert entry.count("<table") == 3, "Parameters, Returns and Raises are tables"
    assert "<code>pixels_per_step</code>" in entry and "SaliencyInputError" in entry
