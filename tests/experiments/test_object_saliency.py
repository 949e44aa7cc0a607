"""experiments.objects.run helpers on known answers (the study itself runs minutes)."""
import csv
import gzip
import json

import numpy as np

from experiments.objects.run import (INTERVAL, bootstrap_ci, bootstrap_interval, top_class, write_per_state,
                                         write_readme)
from jaxsal.metrics import object_attribution
from jaxsal.game_objects import ObjectBoxes


def test_bootstrap_ci_brackets_the_mean_and_drops_nan():
    v = np.r_[np.random.default_rng(0).normal(0.3, 0.1, 400), np.nan]
    lo, hi = bootstrap_ci(v)
    assert lo < 0.3 < hi and hi - lo < 0.05
    assert np.isnan(bootstrap_ci([np.nan])).all()


def test_top_class_is_the_largest_lift_over_chance():
    b = np.zeros((2, 1, 2, 4), np.int16)
    b[:, 0, 0] = (0, 0, 42, 84)        # class 0: half the frame
    b[:, 0, 1] = (60, 60, 62, 62)      # class 1: 4 px
    ob = ObjectBoxes(b, np.tile(np.array([0, 1], np.int8), (2, 1, 1)), ("big", "small"))
    maps = np.zeros((2, 84, 84), np.float32)
    maps[0, :42] = 1.0                  # all on the big class: lift 0.5
    maps[1, :42] = 1.0
    maps[1, 60:62, 60:62] = 2000.0      # most mass on the small class: lift ~0.8
    np.testing.assert_array_equal(top_class(object_attribution(maps, ob)), [0, 1])
    assert top_class(object_attribution(np.zeros((2, 84, 84)), ob)).tolist() == [-1, -1]


def test_bootstrap_ci_resamples_blocks_of_consecutive_states():
    # 400 states in 16 runs of 25 identical values: only 16 independent draws, so the interval
    # must be as wide as the spread of 16 run means, not of 400 states.
    runs = np.random.default_rng(1).normal(0.0, 1.0, 16)
    v = np.repeat(runs, 25)
    lo, hi = bootstrap_ci(v)
    se_runs = runs.std(ddof=1) / np.sqrt(16)
    assert hi - lo > 2.5 * se_runs          # ~3.9 se for a 95% interval
    assert hi - lo > 3 * (2 * 1.96 * v.std() / np.sqrt(400))


def test_intervals_follow_the_series_autocorrelation():
    # an AR(1) series (rho 0.9): the automatic block length is long and the interval wider than
    # the one that treats the states as independent
    rng = np.random.default_rng(2)
    x = np.zeros(500)
    for t in range(1, 500):
        x[t] = 0.9 * x[t - 1] + rng.normal()
    r = bootstrap_interval(x)
    iid = 2 * 1.96 * x.std() / np.sqrt(500)
    assert r["block_len"] > 5
    assert r["ci"][1] - r["ci"][0] > 2 * iid


def _summary(game, interval):
    row = {"share": 0.1, "ci": [0.05, 0.15], "chance": 0.01, "random_map_share": 0.01, "states": 10}
    return {"game": game, "agent": game, "states": 10, "policy": "greedy", "classes": ["ball"], "interval": interval,
            "methods": {"gradient": {"ball": row}}, "pointing": {"random_map": {"on_any_object": 0.1, "chance": 0.1}}}


def test_the_readme_labels_intervals_over_25_state_blocks_as_too_short(tmp_path):
    old = "95% percentile block bootstrap of the mean over states in play order, blocks of 25, 10000 resamples"
    for game, interval in (("pong", old), ("breakout", INTERVAL)):
        (tmp_path / game).mkdir()
        (tmp_path / game / "summary.json").write_text(json.dumps(_summary(game, interval)))
    write_readme(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "**The intervals of pong are too short" in text
    assert "One agent per game was explained" in text and "these states of one agent" in text
    assert f"Intervals: {INTERVAL}." in text


def test_the_readme_gives_each_class_s_n_and_the_shares_before_training(tmp_path):
    s = _summary("breakout", INTERVAL)
    s["training_stages"] = {"random_init": {"gradient": {"ball": 0.25}}, "trained": {"gradient": {"ball": 0.1}}}
    (tmp_path / "breakout").mkdir()
    (tmp_path / "breakout" / "summary.json").write_text(json.dumps(s))
    write_readme(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| states showing the class (N of each mean) | 10 |" in text
    assert "| random_init | gradient | 0.250 |" in text and "| trained |" not in text
    assert "does not show what the agent learned" in text


def test_the_committed_readme_is_what_write_readme_gives(tmp_path):
    """experiments/results/objects/README.md is generated: edit `write_readme`, not the page."""
    from experiments.objects.run import OUT
    for f in OUT.glob("*/summary.json"):
        (tmp_path / f.parent.name).mkdir()
        (tmp_path / f.parent.name / "summary.json").write_text(f.read_text())
    write_readme(tmp_path)
    assert (tmp_path / "README.md").read_text() == (OUT / "README.md").read_text(), (
        "experiments/results/objects/README.md differs from write_readme's output: regenerate it")


def test_per_state_shares_are_written_in_play_order(tmp_path):
    b = np.zeros((3, 1, 1, 4), np.int16)
    b[:, 0, 0] = (0, 0, 42, 84)
    labels = np.array([[[0]], [[-1]], [[0]]], np.int8)      # the class is absent from state 1
    maps = np.ones((3, 84, 84), np.float32)
    shares = {"gradient": object_attribution(maps, ObjectBoxes(b, labels, ("half",)))}
    write_per_state(shares, tmp_path / "s.csv.gz")
    rows = list(csv.DictReader(gzip.open(tmp_path / "s.csv.gz", "rt")))
    assert [r["state"] for r in rows] == ["0", "1", "2"]
    assert [r["share"] for r in rows] == ["0.5", "", "0.5"]
