"""The before/after benchmark runs two checkouts side by side and reports their maps agree."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import ROOT


@pytest.mark.slow
def test_engine_ab_runs_two_checkouts_and_checks_their_maps(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git history")
    out = tmp_path / "ab"
    subprocess.run([sys.executable, "-m", "experiments.benchmarks.engine_ab", "--before", "HEAD",
                    "--after", "HEAD", "--batch", "2", "--rounds", "2", "--repeats", "1",
                    "--methods", "gradient", "gradcam", "--out", str(out),
                    "--flags-after=--xla_cpu_experimental_ynn_fusion_type=individual_dot"],
                   cwd=ROOT, check=True, timeout=600)
    res = json.loads((out / "engine_ab.json").read_text())
    assert res["before"]["commit"] == res["after"]["commit"]
    assert res["after"]["xla_flags"] == "--xla_cpu_experimental_ynn_fusion_type=individual_dot"   # as the worker saw it
    assert "ynn_fusion_type=dot" in res["before"]["xla_flags"]                                     # jaxsal's default
    assert [(r["method"], r["batch"]) for r in res["rows"]] == [("gradient", 2), ("gradcam", 2)]
    for r in res["rows"]:
        assert r["maps_equal"] and len(r["speedup_per_round"]) == 2
        assert all(t > 0 for t in r["before_s"] + r["after_s"])
    assert "| gradcam | 2 |" in (out / "engine_ab.md").read_text()
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "engine_ab_" not in worktrees  # the side checkouts are removed
