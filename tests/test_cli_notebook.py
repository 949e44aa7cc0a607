"""The quick-start notebook runs top to bottom (with a short rollout)."""
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    pytest.importorskip("envpool")
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    monkeypatch.setenv("JAXSAL_NB_STEPS", "6")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "(6, 84, 84, 4) -> (6, 84, 84)" in outputs and "gallery:" in outputs
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook shows the rendered grid"
