"""The quick-start notebook runs top to bottom (with a short rollout)."""
import os

import pytest
from tests._support.notebooks import ROOT, run_notebook


@pytest.mark.slow  # a Jupyter kernel and the whole notebook; the committed outputs are checked fast
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    pytest.importorskip("envpool")
    monkeypatch.setenv("JAXSAL_NB_STEPS", "6")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    text, has_png, _ = run_notebook("quickstart.ipynb", cwd=tmp_path, timeout=600)
    assert "(6, 84, 84, 4) -> (6, 84, 84)" in text and "gallery:" in text
    assert has_png, "the notebook shows the rendered grid"
