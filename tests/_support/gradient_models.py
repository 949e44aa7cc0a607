"""Tiny models with hand-derivable gradients for the gradient/CAM method tests."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class ConvHead(nn.Module):
    """conv (named 'conv', pre-activation output) -> ReLU -> 'fc1' -> ReLU -> 'q'. NHWC."""
    num_actions: int = 3
    features: int = 3
    kernel: int = 1
    stride: int = 1
    hidden: int = 5

    @nn.compact
    def __call__(self, x):
        a = nn.Conv(self.features, (self.kernel, self.kernel), (self.stride, self.stride),
                    padding="VALID", name="conv")(x)
        h = nn.relu(a).reshape((x.shape[0], -1))
        h = nn.relu(nn.Dense(self.hidden, name="fc1")(h))
        return nn.Dense(self.num_actions, name="q")(h)


class LinearConv(nn.Module):
    """conv (named 'conv') -> flatten -> 'q' (no nonlinearity): dY/dA is the q weight."""
    num_actions: int = 3
    features: int = 3
    kernel: int = 2
    stride: int = 2

    @nn.compact
    def __call__(self, x):
        a = nn.Conv(self.features, (self.kernel, self.kernel), (self.stride, self.stride),
                    padding="VALID", name="conv")(x)
        return nn.Dense(self.num_actions, name="q")(a.reshape((x.shape[0], -1)))


class CleanRLNetwork(nn.Module):
    """CleanRL-style trunk: channel-first input transposed inside, auto names, functional relu."""

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1))
        x = x / 255.0
        x = nn.Conv(4, (4, 4), (2, 2), padding="VALID")(x)
        x = nn.relu(x)
        x = nn.Conv(6, (3, 3), (1, 1), padding="VALID")(x)
        x = nn.relu(x)
        x = nn.Conv(5, (2, 2), (1, 1), padding="VALID")(x)
        x = nn.relu(x)
        x = x.reshape((x.shape[0], -1))
        return nn.relu(nn.Dense(16)(x))


class CleanRLActor(nn.Module):
    action_dim: int = 4

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.action_dim)(x)


class CleanRLCritic(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


def cleanrl_agent(seed=0, shape=(1, 2, 16, 16)):
    """(apply_fn, params) of a CleanRL PPO-style composition returning (logits, value)."""
    net, actor, critic = CleanRLNetwork(), CleanRLActor(), CleanRLCritic()
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jnp.zeros(shape)
    pn = net.init(k1, x)
    h = net.apply(pn, x)
    params = {"network": pn, "actor": actor.init(k2, h), "critic": critic.init(k3, h)}

    def apply_fn(p, obs):
        hidden = net.apply(p["network"], obs)
        return actor.apply(p["actor"], hidden), critic.apply(p["critic"], hidden)[:, 0]

    return apply_fn, params


def init(model, shape, seed=0, scale=1.0):
    """Params of a flax model for inputs of `shape`, weights scaled by `scale`."""
    p = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros(shape))  # one compile, not one per op
    return jax.tree.map(lambda w: w * scale, p)


def obs(shape, seed=1, lo=-1.0, hi=1.0):
    return np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), shape, minval=lo, maxval=hi))


def bilinear_ref(m, H, W):
    """Half-pixel-centre bilinear upsampling with edge clamping (cv2.resize INTER_LINEAR)."""
    h, w = m.shape
    out = np.zeros((H, W))
    for i in range(H):
        for j in range(W):
            y = min(max((i + 0.5) * h / H - 0.5, 0), h - 1)
            x = min(max((j + 0.5) * w / W - 0.5, 0), w - 1)
            y0, x0 = int(np.floor(y)), int(np.floor(x))
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = y - y0, x - x0
            out[i, j] = ((1 - dy) * (1 - dx) * m[y0, x0] + (1 - dy) * dx * m[y0, x1]
                         + dy * (1 - dx) * m[y1, x0] + dy * dx * m[y1, x1])
    return out
