"""experiments.paper_b.run end to end on a tiny budget: every output file, sane contents."""
import csv
import json

import pytest

import jaxsal_agents

from experiments.paper_b import run as paper_b


@pytest.mark.slow
def test_paper_b_tiny_run(tmp_path):
    paper_b.main(["--game", "breakout", "--states", "6", "--sanity-states", "4", "--draws", "2",
                  "--block-len", "2", "--methods", "gradient", "rise", "--out", str(tmp_path)])
    out = tmp_path / "breakout"
    for f in ("auc.csv", "auc_per_state.csv.gz", "pairwise.csv", "significance.md", "curves.csv",
              "insertion.png", "deletion.png", "timing.csv", "sanity.csv", "sanity_per_state.csv.gz",
              "sanity.png", "maps.png", "summary.md", "meta.json"):
        assert (out / f).exists(), f
    rows = list(csv.DictReader(open(out / "auc.csv")))
    assert {r["mode"] for r in rows} == {"insertion", "deletion"}
    assert {r["method"] for r in rows} == {"rise", "gradient", "random"}
    assert all(float(r["low"]) <= float(r["mean"]) <= float(r["high"]) for r in rows)
    sanity = list(csv.DictReader(open(out / "sanity.csv")))
    assert {r["randomised"] for r in sanity} == {"q", "fc1", "conv3", "conv2", "conv1",
                                                 "random_uniform", "random_gaussian"}
    assert {r["metric"] for r in sanity} == {"spearman", "ssim_flat", "ssim", "hog"}
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["agent"], meta["states"], meta["sanity_states"], meta["sanity_draws"]) == ("breakout", 6, 4, 2)
    card_return = jaxsal_agents.load("breakout").card["eval"]["mean_return"]
    assert meta["agent_return"] == card_return
    readme = (tmp_path / "README.md").read_text()
    assert f"| breakout | breakout | {card_return:.1f} | 6 | 4 | 2 | 2 |" in readme
    assert "not run: `python -m experiments.paper_b.run --game mspacman`" in readme
    paper_b.main(["--game", "breakout", "--out", str(tmp_path), "--replot"])


def test_game_without_agent_names_the_training_command(tmp_path, monkeypatch):
    monkeypatch.setattr(paper_b.jaxsal_agents, "available", lambda: ["breakout"])   # as before frostbite ships
    with pytest.raises(SystemExit, match="python -m jaxsal_agents.train --game frostbite"):
        paper_b.main(["--game", "frostbite", "--states", "2", "--out", str(tmp_path)])
    assert not (tmp_path / "frostbite").exists()
