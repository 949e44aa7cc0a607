"""Environments: shapes, dtypes and the standard Atari preprocessing; collect()."""
import jax
import numpy as np
import pytest

import jaxsal_agents
from jaxsal_agents.envs import make_env
from jaxsal_agents.zoo import Agent, build_model


@pytest.mark.parametrize("game", ["pong", "breakout", "mspacman", "spaceinvaders", "frostbite", "seaquest"])
def test_atari_env_shapes(game):
    env = make_env(game, num_envs=2, train=True)
    obs = env.reset()
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    obs, reward, done, finished = env.step(np.zeros(2, np.int32))
    assert obs.shape == (2, 84, 84, 4) and reward.shape == (2,) and done.shape == (2,)
    assert isinstance(finished, list)


def test_atari_frame_stack_is_consecutive_frames():
    env = make_env("breakout", num_envs=1, train=False, seed=3)
    obs = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(30):
        new, *_ = env.step(rng.integers(0, env.num_actions, 1))
        # the stack shifts by one: frames 1..3 of the old stack are frames 0..2 of the new one
        np.testing.assert_array_equal(new[0, :, :, :3], obs[0, :, :, 1:])
        obs = new


def test_training_env_clips_rewards_and_eval_does_not():
    for train, check in ((True, lambda r: np.all(np.abs(r) <= 1)), (False, lambda r: True)):
        env = make_env("mspacman", num_envs=2, train=train, seed=0)
        env.reset()
        rewards = [env.step(np.random.default_rng(i).integers(0, env.num_actions, 2))[1] for i in range(300)]
        assert check(np.concatenate(rewards))
    # MsPacman's pellets are worth 10 points each: unclipped in evaluation
    assert np.max(np.concatenate(rewards)) >= 10


@pytest.mark.parametrize("game, channels, actions", [  # asterix and freeway: ~10 CPU s of gymnax compile each
    ("minatar-breakout", 4, 3), ("minatar-spaceinvaders", 6, 4),
    pytest.param("minatar-asterix", 4, 5, marks=pytest.mark.slow),
    pytest.param("minatar-freeway", 7, 3, marks=pytest.mark.slow)])
def test_minatar_env(game, channels, actions):
    env = make_env(game, num_envs=3)
    obs = env.reset()
    assert obs.shape == (3, 10, 10, channels) and env.num_actions == actions
    obs, reward, done, _ = env.step(np.zeros(3, np.int32))
    assert obs.shape == (3, 10, 10, channels)


def test_unknown_game_is_clear_error():
    with pytest.raises(jaxsal_agents.AgentLoadError, match="unknown game 'pacman'.*breakout"):
        make_env("pacman")


def test_collect_returns_replay_batch():
    model = build_model("breakout", "dqn", 4)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    agent = Agent("random-init", model, params, {"game": "breakout", "num_actions": 4})
    batch = jaxsal_agents.collect(agent, 20, num_envs=2, epsilon=0.5)
    assert len(batch) == 40
    assert batch.obs.shape == (40, 84, 84, 4) and batch.obs.dtype == np.uint8
    assert batch.actions.shape == batch.rewards.shape == batch.dones.shape == (40,)
    assert batch.outputs.shape == (40, 4)
    # outputs are the agent's output on the stored observations (env 0's 5th step)
    np.testing.assert_allclose(batch.outputs[4], model.apply(params, batch.obs[4:5])[0], rtol=1e-4, atol=1e-4)
    greedy = jaxsal_agents.collect(agent, 10, epsilon=0.0)
    np.testing.assert_array_equal(greedy.actions, greedy.outputs.argmax(-1))


class _NumberedEnv:
    """Fake env of 2 envs: env e's frame at step t is 100 e + t; env 0's game ends at step 1, env 1's at step 3."""
    num_envs, num_actions = 2, 2

    def reset(self):
        self.t = 0
        return self._obs()

    def _obs(self):
        return np.array([100 * e + self.t for e in range(2)], np.float32).reshape(2, 1, 1, 1)

    def step(self, actions):
        self.t += 1
        done = np.array([self.t == 2, self.t == 4], np.float32)
        return self._obs(), np.array([100 * e + self.t - 1 for e in range(2)], np.float32), done, []


class _ReadsPixel:
    """apply(params, obs): Q = (pixel, 0): greedy action 0 on every frame but the first."""
    @staticmethod
    def apply(params, obs):
        v = obs.reshape(obs.shape[0], -1)[:, :1]
        return jax.numpy.concatenate([v, jax.numpy.full_like(v, 0.5)], -1)


def test_collect_is_env_major_and_until_done_waits_for_every_env():
    """Row e * T + t holds env e's state at step t with the action, reward and done of that step; with
    until_done, collection ends on the step where the last env finishes its first game."""
    agent = Agent("fake", _ReadsPixel(), None, {"game": "minatar-breakout", "num_actions": 2})
    batch = jaxsal_agents.collect(agent, 3, env=_NumberedEnv())
    assert batch.obs.ravel().tolist() == [0, 1, 2, 100, 101, 102]
    assert batch.rewards.tolist() == [0, 1, 2, 100, 101, 102]
    assert batch.dones.tolist() == [0, 1, 0, 0, 0, 0]
    assert batch.actions.tolist() == [1, 0, 0, 0, 0, 0]                # frame 0: Q = (0, 0.5)
    assert batch.outputs[:, 0].tolist() == [0, 1, 2, 100, 101, 102]
    done = jaxsal_agents.collect(agent, 10, env=_NumberedEnv(), until_done=True)
    assert len(done) == 8 and done.obs.ravel().tolist() == [0, 1, 2, 3, 100, 101, 102, 103]


def _play_and_sum(env, steps, seed=0):
    """Random play; per step the env's outputs and the full-game returns a slow running sum of the
    (unclipped) rewards gives on the steps whose `done` ends a game."""
    rng, acc, rows = np.random.default_rng(seed), np.zeros(env.num_envs), []
    env.reset()
    for _ in range(steps):
        obs, reward, done, finished = env.step(rng.integers(0, env.num_actions, env.num_envs))
        acc += reward
        want = [float(acc[i]) for i in np.flatnonzero(done)]
        acc[done.astype(bool)] = 0.0
        rows.append((obs, reward, done, finished, want))
    return rows


def test_atari_done_is_a_lost_life_in_training_and_a_game_over_in_evaluation():
    """Same seed and actions, so the same games: training's `done` also fires on every lost life,
    evaluation's only when a full game ends; `finished_returns` are each game's unclipped sum (games
    cut short at max_episode_steps count), restarting from 0 for the next game."""
    train = _play_and_sum(make_env("breakout", 2, train=True, seed=4, max_episode_steps=150), 400)
    evals = _play_and_sum(make_env("breakout", 2, train=False, seed=4, max_episode_steps=150), 400)
    d_train, d_eval = (np.array([r[2] for r in rows], bool) for rows in (train, evals))
    for (o1, r1, *_), (o2, r2, *_) in zip(train, evals):
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, np.sign(r2))
    assert (d_train | ~d_eval).all() and d_train.sum() > d_eval.sum() >= 3
    assert [r[3] for r in evals] == [r[4] for r in evals]
    games = [x for r in evals for x in r[3]]
    assert len(games) >= 3 and max(games) > 0


def test_minatar_finished_returns_are_each_games_sum():
    """gymnax resets inside the done step: the finished game's return is listed there, and the next game
    starts from 0."""
    rows = _play_and_sum(make_env("minatar-breakout", 3, seed=2), 300)
    assert [r[3] for r in rows] == [r[4] for r in rows]
    games = [x for r in rows for x in r[3]]
    assert len(games) >= 6 and max(games) > 0
