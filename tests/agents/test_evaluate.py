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


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_play_games_one_game_per_env_unclipped():
    agent = jaxsal_agents.load("breakout")
    rets = play_games(agent, episodes=2, seed=5, max_steps=400)
    assert len(rets) == 2 and all(r >= 0 for r in rets)


def test_active_actions_match_the_full_batch_and_compile_few_shapes():
    """Only the games still going are evaluated; their actions equal the full batch's."""
    import jax.numpy as jnp

    from jaxsal_agents.evaluate import _active_actions

    shapes = []

    def policy(p, o):
        shapes.append(o.shape[0])
        return jnp.argmax(o @ p, -1)

    rng = np.random.default_rng(0)
    w, obs = jnp.asarray(rng.normal(size=(3, 4))), rng.normal(size=(30, 3))
    full = np.asarray(policy(w, jnp.asarray(obs)))
    for n_active in (30, 29, 17, 16, 9, 5, 1, 0):
        active = np.zeros(30, bool)
        active[rng.choice(30, n_active, replace=False)] = True
        got = _active_actions(policy, w, obs, active)
        assert np.array_equal(got[active], full[active]) and not got[~active].any()
    assert set(shapes) <= {30, 16, 8, 4, 2, 1}   # a handful of compiled shapes, never one per count


@pytest.mark.slow
def test_play_games_equals_the_plain_full_batch_loop():
    """The active-games shortcut changes no return (reference: the network on every env, every step)."""
    agent = jaxsal_agents.load("minatar-breakout")
    from jaxsal_agents.envs import make_env
    from jaxsal_agents.evaluate import greedy_actions

    episodes, seed, max_steps = 6, 3, 400
    env = make_env(agent.game, episodes, train=False, seed=seed)
    obs, done, running = env.reset(), np.zeros(episodes, bool), np.zeros(episodes)
    ref, partly_done = [None] * episodes, False
    for _ in range(max_steps):
        obs, reward, step_done, _ = env.step(np.asarray(greedy_actions(agent.apply_fn(agent.params, obs))))
        running += np.where(done, 0.0, reward)
        for i in np.flatnonzero(step_done.astype(bool) & ~done):
            ref[i] = float(running[i])
        done |= step_done.astype(bool)
        partly_done |= 0 < done.sum() < episodes
        if done.all():
            break
    ref = [r if r is not None else float(running[i]) for i, r in enumerate(ref)]
    assert partly_done    # the games end at different steps, so the shortcut is exercised
    assert play_games(agent, episodes=episodes, seed=seed, max_steps=max_steps) == ref


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
