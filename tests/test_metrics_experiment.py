"""experiments.paper_b end to end on a tiny budget: every output file, sane contents."""
import csv
import json

import pytest

from experiments import paper_b


@pytest.mark.slow
def test_paper_b_tiny_run(tmp_path):
    paper_b.main(["--game", "breakout", "--states", "3", "--sanity-states", "2",
                  "--methods", "gradient", "rise", "--out", str(tmp_path)])
    out = tmp_path / "breakout"
    for f in ("insertion.csv", "insertion.md", "insertion_per_state.csv", "timing.csv", "sanity.csv",
              "sanity.png", "maps.png", "summary.md", "meta.json"):
        assert (out / f).exists(), f
    rows = list(csv.DictReader(open(out / "insertion.csv")))
    assert [r["method"] for r in rows] == ["rise", "gradient", "random"]
    sanity = list(csv.DictReader(open(out / "sanity.csv")))
    assert {r["randomised"] for r in sanity} == {"q", "fc1", "conv3", "conv2", "conv1",
                                                 "random_uniform", "random_gaussian"}
    assert json.loads((out / "meta.json").read_text())["states"] == 3
    paper_b.main(["--game", "breakout", "--out", str(tmp_path), "--replot"])
