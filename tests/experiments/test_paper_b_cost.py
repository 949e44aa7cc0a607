"""Paper B's cost at two commits: both checkouts time the study's methods, the maps are compared,
and the hours per game follow the re-run's counts."""
import json
import subprocess
import sys

import pytest

from experiments.paper_b import cost as PBC
from experiments.paper_b import rerun
from tests._support import ROOT


def test_hours_per_game_count_the_reruns_maps():
    maps = rerun.STATES + rerun.DRAWS * 5 * rerun.SANITY_STATES      # 1,000 + 10 x 5 x 200
    assert maps == 11_000
    assert PBC.hours_per_game(1000.0) == pytest.approx(maps / 3600)
    # the sanity maps at the sanity check's own speed
    assert PBC.hours_per_game(1000.0, 500.0) == pytest.approx((1000 + 10_000 * 0.5) / 3600)


@pytest.mark.slow
def test_paper_b_cost_runs_two_checkouts_and_compares_their_maps(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git history")
    out = tmp_path / "cost"
    subprocess.run([sys.executable, "-m", "experiments.paper_b.cost", "--before", "HEAD", "--after",
                    "HEAD", "--rounds", "2", "--labels", "gradient", "gradcam", "--out", str(out)],
                   cwd=ROOT, check=True, timeout=900)
    res = json.loads((out / "paper_b_cost.json").read_text())
    assert res["commits"]["before"] == res["commits"]["after"]
    assert [r["label"] for r in res["methods"]] == ["gradient", "gradcam"]
    assert all(r["max_abs_map_difference"] == 0 and r["before_ms_per_map"] > 0 for r in res["methods"])
    for r in res["methods"]:   # the sanity check timed on each side (10 draws x 5 layers x 4 states)
        assert r["before_sanity_ms_per_map"] > 0 and r["after_sanity_ms_per_map"] > 0
        assert r["hours"]["after"] == pytest.approx(PBC.hours_per_game(r["after_ms_per_map"], r["after_sanity_ms_per_map"])
                                                    + r["after_sanity_compile_s"] / 3600)
    assert res["hours_per_game"]["after"] == pytest.approx(sum(r["hours"]["after"] for r in res["methods"]))
    assert "| gradcam |" in (out / "paper_b_cost.md").read_text()
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "paper_b_cost_" not in worktrees
