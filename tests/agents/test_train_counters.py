"""The trainers' counters on a fake env (no emulator): which update's params the target network holds,
the first update that learns (learning_starts), and the returns log a resume keeps. Each run's params
are recorded after every update (the callback) and compared with what the definitions say."""
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
