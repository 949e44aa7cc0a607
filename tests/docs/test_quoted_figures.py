"""The maps/s and states-timed figures the docs quote from the throughput results are that file's
(`python -m experiments.benchmarks.throughput --render ... --docs docs/benchmarks.md` writes them)."""
import json

from experiments.benchmarks.throughput import FIGURE, figure, quoted_figures
from tests._support import ROOT

RESULTS = json.loads((ROOT / "experiments" / "results" / "throughput_cpu.json").read_text())
PAGES = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "methods").glob("*.md"))]


def test_every_quoted_figure_is_the_results_files():
    quoted = [(p.name, m) for p in PAGES for m in FIGURE.finditer(p.read_text())]
    assert len(quoted) >= 25
    wrong = [(page, m["what"], m["case"], m["value"], figure(RESULTS, m["what"], m["case"]))
             for page, m in quoted if m["value"] != figure(RESULTS, m["what"], m["case"])]
    assert not wrong, f"stale figures (page, what, case, quoted, results): {wrong}; rerun the --render command"


def test_a_page_citing_the_results_file_quotes_through_markers():
    bare = [p.name for p in PAGES if "throughput_cpu.md" in p.read_text() and not FIGURE.search(p.read_text())]
    assert not bare


def test_the_render_rewrites_a_stale_figure(tmp_path):
    page = tmp_path / "m.md"
    page.write_text("x <!-- maps/s gradient -->1<!-- end --> maps/s, <!-- states lime (slic, 2000 samples) --><!-- end -->")
    assert quoted_figures(RESULTS, [page]) == [page]
    values = [m["value"] for m in FIGURE.finditer(page.read_text())]
    assert values == [figure(RESULTS, "maps/s", "gradient"), figure(RESULTS, "states", "lime (slic, 2000 samples)")]
