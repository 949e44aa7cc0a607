"""The objects guide's picture (docs/images/breakout_effects.png) is rebuilt from committed data
by docs/_build/objects_picture.py, and the numbers the guide quotes are the picture's."""
from __future__ import annotations

import importlib.util
import re

import pytest

from tests._support import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("objects_picture", ROOT / "docs" / "_build" / "objects_picture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_guide_quotes_the_pictured_state_s_numbers(tmp_path):
    pytest.importorskip("jaxsal_agents")
    mod = _script()
    assert mod.DATA.stat().st_size < 10_000                          # a few KB: one state and its boxes
    got = mod.draw(tmp_path / "pic.png")
    assert (tmp_path / "pic.png").stat().st_size > 5_000
    guide = (ROOT / "docs" / "guides" / "objects.md").read_text()
    para = guide[guide.index("![Breakout frame 8"):]
    para = para[:para.index("## Moving an object")]
    c = got["classes"]
    for name in ("ball", "paddle", "bricks"):
        assert f"{c[name]['share']:.3f}" in para and f"{c[name]['chance']:.3f}" in para, name
        assert f"{name} {c[name]['drop']:.2f}" in para, name         # the alt text's bars
    assert f"{c['ball']['share'] / c['ball']['chance']:.1f} times chance" in para
    assert f"of its {got['q_chosen']:.2f}" in para and c["ball"]["flips"]
    assert re.search(r"answers \*what does the agent do without a ball\*", para)
