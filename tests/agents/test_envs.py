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
