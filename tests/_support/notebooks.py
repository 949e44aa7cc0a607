"""Run a notebook from notebooks/ with nbclient; return its stream text and whether it showed images.

The committed notebooks carry their outputs (documentation where the code is browsed); a run
starts from a copy with the outputs cleared, so the checks below see only what this run printed,
and nothing is written back to the committed file."""
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests._support import ROOT


def run_notebook(name: str, cwd: Path | None = None, timeout: int = 240):
    """Execute notebooks/<name>; fail on any error output. Returns (stream_text, has_png, seconds)."""
    path = ROOT / "notebooks" / name
    committed = path.read_bytes()
    nb = nbformat.reads(committed.decode(), as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    t0 = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd or ROOT / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    assert path.read_bytes() == committed, f"running {name} changed the committed notebook"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    has_png = any("image/png" in o.get("data", {}) for o in outputs)
    return text, has_png, time.time() - t0
