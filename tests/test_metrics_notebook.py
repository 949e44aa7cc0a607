"""The small Paper B notebook runs end to end (nbclient), quickly, without errors."""
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "paper_b_small.ipynb"


def test_paper_b_small_notebook_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.time()
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    elapsed = time.time() - t0
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "Spearman after randomising q only" in text
    assert "black/q_value" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    print(f"notebook ran in {elapsed:.1f} s")
