"""The committed notebooks read as documentation: every code cell ran (in order, without errors),
their pictures are there, they stay small, and their outputs name no machine's paths."""
import json
import re

import pytest

from tests._support.notebooks import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 2_000_000
MACHINE_PATH = re.compile(r"(/work/|/tmp/|/home/|/root/|/Users/|[A-Z]:\\\\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_has_its_outputs(path):
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes; downscale its figures"
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: not executed top to bottom; rerun it (see tests/_support/notebooks.py)"
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no picture"
    text = json.dumps([o.get("text", "") for o in outputs] +            # printed text, not image bytes
                      [v for o in outputs for k, v in o.get("data", {}).items() if not k.startswith("image/")])
    assert not MACHINE_PATH.search(text), f"{path.name}: a machine-specific path in the outputs"


def test_the_quickstart_lists_every_shipped_method():
    """The quick start prints jaxsal.methods(): its committed output lists the methods jaxsal ships now."""
    import jaxsal

    nb = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    listed, = re.findall(r"^methods: (.+)$", text, re.M)
    assert sorted(listed.split(", ")) == sorted(jaxsal.registry.SHIPPED), "rerun notebooks/quickstart.ipynb"
