"""The object study (experiments/objects/run.py) as sweep configs
(experiments/objects/sweep/GAME.toml): the study's methods, options and metric, and (slow) a
sweep over a slice of the study's states giving the study code's maps and object shares."""
import tomllib

import pytest

from experiments.objects.run import METHODS
from jaxsal.io import sweep as sw
from tests._support import ROOT

HERE = ROOT / "experiments" / "objects" / "sweep"
GAMES = ("breakout", "pong", "spaceinvaders")


@pytest.mark.parametrize("game", GAMES)
def test_each_config_is_the_study_for_its_game(game):
    raw = tomllib.loads((HERE / f"{game}.toml").read_text())
    specs = sw.plan_methods(raw)                                        # a valid [methods] table
    assert {s.alias: (s.method, dict(s.options)) for s in specs} == {m: (m, o) for m, o in METHODS.items()}
    assert raw["agents"] == [game] and raw["metrics"] == ["objects"]
    assert raw["inputs"] == [f"data/{game}/obs.npy"]                    # where record.py writes by default
    assert sw.settings(raw)["target"] == "q_chosen"                     # jaxsal.explain's default, as the study


@pytest.mark.slow
def test_a_sweep_over_a_slice_gives_the_study_shares(tmp_path):
    from experiments.objects.sweep.check import compare

    rows, ok = compare("breakout", first=2, work=tmp_path)
    assert len(rows) == len(METHODS) * 3 and {r["class"] for r in rows} == {"ball", "paddle", "bricks"}
    assert all(r["states"] <= 2 for r in rows)
    assert ok, [r for r in rows if not r["same"]]
    assert (tmp_path / "slice" / "obs.objects.npz").exists() and (tmp_path / "out" / "results.csv").exists()
