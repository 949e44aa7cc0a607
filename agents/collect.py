"""Play an agent and return a replay-style batch: the input the saliency engine explains."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .envs import make_env


@dataclasses.dataclass
class Batch:
    """Steps in play order (env-major when num_envs > 1: all of env 0, then env 1, ...).

    obs: (N, H, W, C) state before the action; actions, rewards, dones: (N,);
    outputs: the agent's output pytree on obs, each leaf (N, ...); episode_returns: full-game
    returns of the games that ended during collection.
    """
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    outputs: Any
    episode_returns: list

    def __len__(self):
        return len(self.actions)


def _q(out):
    return out["q"] if isinstance(out, dict) else out


def collect(agent, steps: int, game: str | None = None, epsilon: float = 0.0, num_envs: int = 1,
            seed: int = 0, until_done: bool = False, env=None) -> Batch:
    """Play `agent` (a `jaxsal_agents.Agent`) for `steps` steps per env with epsilon-greedy actions.

    Evaluation settings (true game, no reward clipping, no episodic life). With
    `until_done=True` collection stops early once every env has finished one full game.
    """
    env = env or make_env(game or agent.game, num_envs, train=False, seed=seed)
    policy = jax.jit(agent.apply_fn)
    rng = np.random.default_rng(seed)
    obs = env.reset()
    rows = {k: [] for k in ("obs", "actions", "rewards", "dones")}
    outs, returns = [], []
    finished_env = np.zeros(env.num_envs, bool)
    for _ in range(steps):
        out = policy(agent.params, jnp.asarray(obs))
        greedy = np.asarray(jnp.argmax(_q(out), -1))
        explore = rng.random(env.num_envs) < epsilon
        actions = np.where(explore, rng.integers(0, env.num_actions, env.num_envs), greedy)
        next_obs, reward, done, finished = env.step(actions)
        for k, v in zip(rows, (obs, actions, reward, done)):
            rows[k].append(np.asarray(v))
        outs.append(jax.tree.map(np.asarray, out))
        returns.extend(finished)
        finished_env |= done.astype(bool)
        obs = next_obs
        if until_done and finished_env.all():
            break

    def env_major(x):  # (T, E, ...) -> (E*T, ...)
        x = np.stack(x)
        return np.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])

    return Batch(obs=env_major(rows["obs"]), actions=env_major(rows["actions"]).astype(np.int32),
                 rewards=env_major(rows["rewards"]), dones=env_major(rows["dones"]),
                 outputs=jax.tree.map(lambda *xs: env_major(xs), *outs), episode_returns=returns)
