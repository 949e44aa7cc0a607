"""Flax twins of the Nature-CNN agents people train elsewhere, with their parameter names.

`CleanRLQNetwork`/`CleanRLNetwork`/`CleanRLActor`/`CleanRLCritic` are CleanRL's JAX modules
(`dqn_atari_jax.py`, `ppo_atari_envpool_xla_jax.py`): channel-first input, auto names
Conv_0..2, Dense_0..1. `TorchNatureCNN` runs a converted torch Nature CNN (CleanRL or
Stable-Baselines3): channel-first input and a channel-first flatten, so a torch Linear weight
is used as is (transposed), and the outputs equal torch's to float rounding.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


def _trunk(x):
    x = jnp.transpose(x, (0, 2, 3, 1))
    x = x / 255.0
    x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID")(x))
    return x.reshape((x.shape[0], -1))


class CleanRLQNetwork(nn.Module):
    """CleanRL `dqn_atari_jax.py` QNetwork: (N, 4, 84, 84) 0..255 -> Q (N, A)."""
    action_dim: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(512)(_trunk(x)))
        return nn.Dense(self.action_dim)(x)


class CleanRLNetwork(nn.Module):
    """CleanRL PPO (envpool, JAX) shared trunk: (N, 4, 84, 84) -> hidden (N, 512)."""

    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(512)(_trunk(x)))


class CleanRLActor(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.action_dim)(x)


class CleanRLCritic(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


class TorchNatureCNN(nn.Module):
    """Converted torch Nature CNN: conv1..3 (HWIO kernels), fc1, then `q` (Q-network) or
    `logits` + `value` (actor-critic). Input (N, C, 84, 84) on the 0..255 scale."""
    num_actions: int
    head: str = "q"  # "q" or "actor_critic"

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
        x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID", name="conv2")(x))
        x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID", name="conv3")(x))
        x = jnp.transpose(x, (0, 3, 1, 2)).reshape((x.shape[0], -1))  # torch's (C, H, W) flatten
        h = nn.relu(nn.Dense(512, name="fc1")(x))
        if self.head == "q":
            return nn.Dense(self.num_actions, name="q")(h)
        return {"logits": nn.Dense(self.num_actions, name="logits")(h),
                "value": nn.Dense(1, name="value")(h)[:, 0]}
