"""The small frame-stacking-bug notebook runs end to end (nbclient), quickly, without errors."""
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "frame_stack_bug.ipynb"


def test_frame_stack_bug_notebook_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.time()
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    elapsed = time.time() - t0
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "reversed    [[1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0], [4, 3, 2, 1], [5, 4, 3, 2]]" in text
    assert "None        [[0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]" in text
    assert "saliency_separation_step:" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    print(f"notebook ran in {elapsed:.1f} s")
