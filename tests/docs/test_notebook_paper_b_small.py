"""The small Paper B notebook runs end to end (nbclient), quickly, without errors."""
import pytest

from tests._support.notebooks import run_notebook


@pytest.mark.slow  # a Jupyter kernel and the whole notebook; the committed outputs are checked fast
def test_paper_b_small_notebook_executes():
    text, has_png, seconds = run_notebook("paper_b_small.ipynb")
    assert "Spearman after randomising q only" in text
    assert "black/q_value" in text
    assert has_png
    print(f"notebook ran in {seconds:.1f} s")
