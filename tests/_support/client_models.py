"""Models trained and saved by the real Stable-Baselines3 (torch) and SBX (sbx-rl), for the slow
tests: a tiny image task on Atari-sized frames, and a few hundred steps of each library's DQN.

Imported only where stable_baselines3 / sbx are installed (`make test-slow`'s clients extra).
"""
import gymnasium as gym
import numpy as np


class Frames(gym.Env):
    """84x84x4 uint8 frames with a bright square; reward for the action that names its quadrant."""
    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.q = int(self.np_random.integers(4))
        o = self.np_random.integers(0, 40, (84, 84, 4), dtype=np.uint8)
        r, c = divmod(self.q, 2)
        o[r * 42:r * 42 + 20, c * 42:c * 42 + 20] = 220
        return o

    def step(self, action):
        self.t += 1
        reward = float(action == self.q)
        return self._obs(), reward, self.t >= 16, False, {}


def frames(n=6, seed=0) -> np.ndarray:
    """n frame stacks of the task, (N, 84, 84, 4) uint8."""
    env = Frames()
    env.reset(seed=seed)
    return np.stack([env._obs() for _ in range(n)])


def sb3_dqn(steps=300):
    """An SB3 DQN with its CnnPolicy, trained for `steps` on Frames (gradient steps from 64 on)."""
    import stable_baselines3 as sb3
    model = sb3.DQN("CnnPolicy", Frames(), buffer_size=500, learning_starts=64, batch_size=16,
                    train_freq=4, target_update_interval=50, seed=0, device="cpu")
    return model.learn(steps)


def sbx_dqn(steps=300):
    """An SBX DQN with its CnnPolicy, trained for `steps` on Frames (gradient steps from 64 on)."""
    import sbx
    model = sbx.DQN("CnnPolicy", Frames(), buffer_size=500, learning_starts=64, batch_size=16,
                    train_freq=4, target_update_interval=50, seed=0)
    return model.learn(steps)
