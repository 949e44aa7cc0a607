"""The original network definitions of other libraries' Atari agents, written as they are there,
to check jaxsal's loaders: CleanRL `dqn_atari_jax.py` QNetwork and the PPO envpool JAX
Network/Actor/Critic (flax), and a PureJaxRL-style ActorCritic returning (distribution, value)."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np


class QNetwork(nn.Module):  # cleanrl/dqn_atari_jax.py
    action_dim: int

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1))
        x = x / (255.0)
        x = nn.Conv(32, kernel_size=(8, 8), strides=(4, 4), padding="VALID")(x)
        x = nn.relu(x)
        x = nn.Conv(64, kernel_size=(4, 4), strides=(2, 2), padding="VALID")(x)
        x = nn.relu(x)
        x = nn.Conv(64, kernel_size=(3, 3), strides=(1, 1), padding="VALID")(x)
        x = nn.relu(x)
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(512)(x)
        x = nn.relu(x)
        x = nn.Dense(self.action_dim)(x)
        return x


class Network(nn.Module):  # cleanrl/ppo_atari_envpool_xla_jax.py (initialisers left at flax's)
    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1))
        x = x / (255.0)
        x = nn.relu(nn.Conv(32, kernel_size=(8, 8), strides=(4, 4), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, kernel_size=(4, 4), strides=(2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, kernel_size=(3, 3), strides=(1, 1), padding="VALID")(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(512)(x)
        return nn.relu(x)


class Critic(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


class Actor(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.action_dim)(x)


class Categorical:
    """Stands for distrax.Categorical: PureJaxRL's ActorCritic returns (pi, value)."""

    def __init__(self, logits):
        self.logits = logits


class PureJaxRLActorCritic(nn.Module):  # PureJaxRL's MinAtar-style actor-critic (MLP on flat frames)
    action_dim: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        a = nn.tanh(nn.Dense(64)(x))
        a = nn.Dense(self.action_dim)(nn.tanh(nn.Dense(64)(a)))
        c = nn.tanh(nn.Dense(64)(x))
        c = nn.Dense(1)(nn.tanh(nn.Dense(64)(c)))
        return Categorical(a), jnp.squeeze(c, axis=-1)


def atari_nchw(n: int, seed: int = 0) -> np.ndarray:
    """uint8 frame stacks (N, 4, 84, 84): dark background, bricks, a few bright dots."""
    rng = np.random.default_rng(seed)
    x = (rng.random((n, 4, 84, 84)) < 0.05).astype(np.uint8) * 200
    x[:, :, 20:24, 8:76] = 140
    return x


def torch_modules(num_actions: int):
    """CleanRL dqn_atari.py QNetwork / ppo_atari Agent, SB3 DQNPolicy / ActorCriticCnnPolicy
    module trees (their state_dict names), each with its forward on (N, 4, 84, 84) frames."""
    import torch
    from torch import nn as tnn

    def nature():
        return [tnn.Conv2d(4, 32, 8, stride=4), tnn.ReLU(), tnn.Conv2d(32, 64, 4, stride=2), tnn.ReLU(),
                tnn.Conv2d(64, 64, 3, stride=1), tnn.ReLU(), tnn.Flatten()]

    class CleanRLQ(tnn.Module):  # cleanrl/dqn_atari.py
        def __init__(self):
            super().__init__()
            self.network = tnn.Sequential(*nature(), tnn.Linear(3136, 512), tnn.ReLU(), tnn.Linear(512, num_actions))

        def forward(self, x):
            return self.network(x / 255.0)

    class CleanRLPPO(tnn.Module):  # cleanrl/ppo_atari_envpool.py Agent
        def __init__(self):
            super().__init__()
            self.network = tnn.Sequential(*nature(), tnn.Linear(64 * 7 * 7, 512), tnn.ReLU())
            self.actor = tnn.Linear(512, num_actions)
            self.critic = tnn.Linear(512, 1)

        def forward(self, x):
            h = self.network(x / 255.0)
            return self.actor(h), self.critic(h)[:, 0]

    class NatureCNN(tnn.Module):  # stable_baselines3/common/torch_layers.py
        def __init__(self):
            super().__init__()
            self.cnn = tnn.Sequential(*nature())
            self.linear = tnn.Sequential(tnn.Linear(3136, 512), tnn.ReLU())

        def forward(self, x):
            return self.linear(self.cnn(x))

    class SB3QNetwork(tnn.Module):
        def __init__(self):
            super().__init__()
            self.features_extractor = NatureCNN()
            self.q_net = tnn.Sequential(tnn.Linear(512, num_actions))

        def forward(self, x):
            return self.q_net(self.features_extractor(x.float() / 255.0))

    class SB3DQNPolicy(tnn.Module):
        def __init__(self):
            super().__init__()
            self.q_net, self.q_net_target = SB3QNetwork(), SB3QNetwork()

        def forward(self, x):
            return self.q_net(x)

    class SB3ActorCritic(tnn.Module):  # ActorCriticCnnPolicy, share_features_extractor=True
        def __init__(self):
            super().__init__()
            self.features_extractor = NatureCNN()
            self.pi_features_extractor = self.features_extractor
            self.vf_features_extractor = self.features_extractor
            self.mlp_extractor = tnn.Module()
            self.action_net = tnn.Linear(512, num_actions)
            self.value_net = tnn.Linear(512, 1)

        def forward(self, x):
            h = self.features_extractor(x.float() / 255.0)
            return self.action_net(h), self.value_net(h)[:, 0]

    torch.manual_seed(0)
    return {"cleanrl_dqn": CleanRLQ(), "cleanrl_ppo": CleanRLPPO(), "sb3_dqn": SB3DQNPolicy(),
            "sb3_ppo": SB3ActorCritic()}
