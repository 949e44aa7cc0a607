"""The documentation site builds with no warnings (`mkdocs build --strict`, as `make docs` runs it).

Slow: it imports jaxsal for the API reference and converts the notebooks (with their committed
outputs, nothing executed). Skipped where the docs extra is not installed (`pip install -e '.[docs]'`;
`make test-slow` installs it). The site is built once per session (tests/conftest.py).
"""
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
