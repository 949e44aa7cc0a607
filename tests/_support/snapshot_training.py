"""A fake MinAtar-like env and a tiny PQN run for the snapshot tests (tests/agents/test_snapshots.py,
test_snapshot_board.py; their probe set is the `probe_setup` fixture, tests/agents/conftest.py)."""
import numpy as np

from jaxsal_agents.framestack import FrameStackEnv


class RandomGridEnv:
    """Fake MinAtar-like single-frame env (no gymnax compile): seeded random binary 10x10x3
    frames, reward 1 when the action matches a hidden bit, episodes of 7 steps."""
    num_actions, obs_shape = 3, (10, 10, 3)

    def __init__(self, num_envs, seed=0):
        self.n, self.rng, self.t = num_envs, np.random.default_rng(seed), 0

    def _obs(self):
        return (self.rng.random((self.n,) + self.obs_shape) < 0.2).astype(np.float32)

    def reset(self):
        self.t = 0
        return self._obs()

    def step(self, actions):
        self.t += 1
        reward = (np.asarray(actions) == self.rng.integers(0, 3, self.n)).astype(np.float32)
        done = np.full(self.n, self.t % 7 == 0, np.float32)
        return self._obs(), reward, done, [float(self.t)] * int(done.sum())


def env_fn(game="fake", num_envs=4, train=True, seed=0):
    return FrameStackEnv(RandomGridEnv(num_envs, seed), num_frames=4)


def pqn_config(tmp_path, d):
    """A PQN run of 6 updates on the fake env, its run folder tmp_path/d."""
    from jaxsal_agents.train import PQNConfig
    return PQNConfig(game="minatar-breakout", steps=4 * 4 * 6, num_envs=4, rollout=4, minibatches=2,
                     epochs=1, run_dir=str(tmp_path / d), ckpt_every=1000)
