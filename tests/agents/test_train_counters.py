"""The trainers' loops on a fake env (no emulator): the rollout an update learns from, which update's
params the target network holds, the first update that learns (learning_starts), and the returns log a
resume keeps. Each run's params are recorded after every update (the callback) and compared with what
the definitions say."""
import csv

import jax
import numpy as np

from jaxsal_agents.networks import MinAtarDQN, MinAtarDuelingDQN
from tests._support.snapshot_training import env_fn, pqn_config


def _recorder(seen):
    return lambda update, params, **kw: seen.__setitem__(update, params)


def _equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_pqn_target_network_holds_the_params_of_the_last_multiple_of_target_every(tmp_path):
    """With --target-every 2, after 3 updates the target is the online params of update 2 (not 1, not 3)."""
    from jaxsal_agents.checkpoint import restore_train_state
    from jaxsal_agents.train import initial_state, make_optimizer, train

    cfg = pqn_config(tmp_path, "tn")
    cfg.target_every, cfg.steps = 2, 4 * 4 * 3
    env = env_fn()
    model = MinAtarDQN(env.num_actions, env.obs_shape[-1])
    seen = {}
    train(cfg, log=lambda m: None, callback=_recorder(seen), env_fn=env_fn, model=model)
    assert sorted(seen) == [1, 2, 3]
    state = restore_train_state(tmp_path / "tn" / "ckpt", initial_state(cfg, model, make_optimizer(cfg), env.obs_shape))
    assert state["update"] == 3 and _equal(state["params"], seen[3])
    assert _equal(state["target"], seen[2]) and not _equal(state["target"], seen[1])


def test_dqn_learns_from_the_update_that_reaches_learning_starts_and_syncs_the_target_every_kth(tmp_path):
    """learning_starts = one update's transitions: update 1 already takes gradient steps; with target_every 2
    the target after 3 updates is the online params of update 2."""
    from jaxsal_agents import train_dqn as T

    cfg = T.DQNConfig(game="minatar-breakout", steps=4 * 4 * 3, num_envs=4, rollout=4, buffer_size=64, batch_size=8,
                      grad_steps=1, learning_starts=16, target_every=2, ckpt_every=1000, run_dir=str(tmp_path / "d"))
    env = env_fn()
    model = MinAtarDuelingDQN(env.num_actions, env.obs_shape[-1])
    init = T.initial_state(cfg, model, T.make_optimizer(cfg), env, env.reset())["params"]
    seen = {}
    out = T.train(cfg, log=lambda m: None, callback=_recorder(seen), env_fn=env_fn, model=model)
    assert not _equal(seen[1], init)                 # 16 transitions stored >= learning_starts: it learned
    assert _equal(out["target"], seen[2]) and not _equal(out["target"], seen[3])


def test_dqn_resume_keeps_only_the_games_finished_before_the_checkpoint(tmp_path):
    """A game logged at step s ended during the env step that started at s; the checkpoint at step S holds
    the games with s < S, so rows at S and later (written after the checkpoint, then lost) are cut."""
    from jaxsal_agents.train_dqn import _resume_returns

    path = tmp_path / "returns.csv"
    rows = [(0, 1.0), (48, 2.0), (60, 3.0), (64, 4.0), (80, 5.0)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "return", "wall_s"])
        w.writerows([(s, r, 0.1) for s, r in rows])
    assert _resume_returns(path, 64) == [1.0, 2.0, 3.0]
    with open(path, newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [0, 48, 60]


class _Recorded:
    """A fake env that keeps what it handed out: the observations (reset's first), actions, rewards, dones."""

    def __init__(self, env):
        self.env, self.num_actions, self.obs_shape = env, env.num_actions, env.obs_shape
        self.obs, self.actions, self.rewards, self.dones = [], [], [], []

    def reset(self):
        self.obs.append(self.env.reset())
        return self.obs[-1]

    def step(self, actions):
        obs, reward, done, finished = self.env.step(actions)
        self.obs.append(obs)
        self.actions.append(np.asarray(actions))
        self.rewards.append(reward)
        self.dones.append(done)
        return obs, reward, done, finished


def test_pqn_learns_from_the_states_it_acted_on(tmp_path, monkeypatch):
    """The first update's rollout is (s_t, a_t, r_t, d_t) for t < T with s_t the observation the action a_t was
    chosen on (s_0 from reset), r_t and d_t what that step returned, and s_T (the bootstrap) the last one."""
    from jaxsal_agents import train as P

    made, calls = [], []
    real = P.make_update

    def spy(model, tx, cfg):
        update = real(model, tx, cfg)
        return lambda *args: calls.append([np.asarray(a) for a in args[4:]]) or update(*args)

    def recorded_env(*args, **kw):
        made.append(_Recorded(env_fn(*args, **kw)))
        return made[-1]

    monkeypatch.setattr(P, "make_update", spy)
    cfg = pqn_config(tmp_path, "roll")
    cfg.steps = 4 * 4 * 1
    env = env_fn()
    P.train(cfg, log=lambda m: None, env_fn=recorded_env, model=MinAtarDQN(env.num_actions, env.obs_shape[-1]))
    (rec,), (args,) = made, calls
    obs, actions, rewards, dones, q_max, greedy, last_obs = args
    np.testing.assert_array_equal(obs, np.stack(rec.obs[:4]))
    np.testing.assert_array_equal(last_obs, rec.obs[4])
    np.testing.assert_array_equal(actions, np.stack(rec.actions))
    np.testing.assert_array_equal(rewards, np.stack(rec.rewards))
    np.testing.assert_array_equal(dones, np.stack(rec.dones))
