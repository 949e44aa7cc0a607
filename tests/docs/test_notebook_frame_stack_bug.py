"""The small frame-stacking-bug notebook runs end to end (nbclient), quickly, without errors."""
import pytest

from tests._support.notebooks import run_notebook


@pytest.mark.slow  # a Jupyter kernel and the whole notebook; the committed outputs are checked fast
def test_frame_stack_bug_notebook_executes():
    text, has_png, seconds = run_notebook("frame_stack_bug.ipynb")
    assert "reversed    [[1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0], [4, 3, 2, 1], [5, 4, 3, 2]]" in text
    assert "None        [[0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]" in text
    assert "saliency_separation_step:" in text
    # the detector statistic on hand-made shares: age 2 (1 - p) minus its first value
    assert "age gain, window 1: [0.0, 0.0, -0.3, -0.6, -0.9, -0.9]" in text
    assert "age gain, window 4: [0.0, 0.0, -0.1, -0.225, -0.45, -0.675]" in text
    assert "reversed slots    : [0.0, 0.0, 0.3, 0.6, 0.9, 0.9]" in text
    assert has_png
    print(f"notebook ran in {seconds:.1f} s")
