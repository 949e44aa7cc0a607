"""jaxsal_agents.evaluate: the protocol's summary (mean, std, 95% CI) and the card it writes."""
import json

import numpy as np
import pytest

import jaxsal_agents
from jaxsal_agents.evaluate import evaluate_agent, play_games, summarise, update_card


def test_summary_ci_is_student_t_of_the_mean():
    from scipy import stats

    x = [3.0, 5.0, 4.0, 10.0, 7.0]
    s = summarise(x)
    m, sd = np.mean(x), np.std(x, ddof=1)
    half = stats.t.ppf(0.975, 4) * sd / np.sqrt(5)
    assert s["episodes"] == 5 and s["mean_return"] == pytest.approx(m) and s["std_return"] == pytest.approx(sd)
    assert s["ci95"] == pytest.approx([m - half, m + half])
    # brute force: the t interval covers the true mean ~95% of the time on normal samples
    rng = np.random.default_rng(0)
    hits = [lo <= 1.0 <= hi for lo, hi in (summarise(rng.normal(1.0, 2.0, 30))["ci95"] for _ in range(400))]
    assert 0.91 < np.mean(hits) < 0.99
    assert summarise([2.0, 2.0, 2.0])["ci95"] == [2.0, 2.0]


def test_play_games_one_game_per_env_unclipped():
    agent = jaxsal_agents.load("breakout")
    rets = play_games(agent, episodes=2, seed=5, max_steps=400)
    assert len(rets) == 2 and all(r >= 0 for r in rets)


def test_evaluate_updates_the_card(tmp_path):
    agent = jaxsal_agents.load("minatar-breakout")
    card = dict(agent.card)
    (tmp_path / "a.json").write_text(json.dumps(card))
    (tmp_path / "a.msgpack").write_bytes((jaxsal_agents.zoo.SHIPPED_DIR / "minatar-breakout.msgpack").read_bytes())
    res = evaluate_agent(jaxsal_agents.load(str(tmp_path / "a.json")), episodes=4)
    update_card(str(tmp_path / "a.json"), res)
    new = json.loads((tmp_path / "a.json").read_text())
    assert new["eval"]["episodes"] == 4 and len(new["eval"]["returns"]) == 4
    lo, hi = new["eval"]["ci95"]
    assert lo <= new["eval"]["mean_return"] <= hi
    assert new["params_sha256"] == card["params_sha256"]  # the rest of the card is kept
