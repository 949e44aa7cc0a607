"""Tiny agents for the perturbation-method tests: a plain-function CNN and a flax CNN."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

H, W, C, A = 12, 12, 2, 3


@jax.jit  # one compile, not one per op (many test modules build these at import)
def _tiny_params(seed):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"k": jax.random.normal(k1, (3, 3, C, 4)) * 0.5,
            "w": jax.random.normal(k2, (5 * 5 * 4, A)) * 0.3,
            "b": jax.random.normal(k3, (A,)) * 0.1}


def tiny_params(seed=0):
    return _tiny_params(seed)


def tiny_apply(params, obs):
    """Plain JAX CNN on (N, 12, 12, 2) frames on the 0-255 scale -> Q (N, 3)."""
    x = jnp.asarray(obs, jnp.float32) / 255.0
    h = jax.lax.conv_general_dilated(x, params["k"], (2, 2), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jnp.tanh(h).reshape(x.shape[0], -1)
    return h @ params["w"] * 3.0 + params["b"]


class TinyFlax(nn.Module):
    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        x = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        return {"q": nn.Dense(A, name="q")(x.reshape(x.shape[0], -1)) * 3.0}


def tiny_obs(n=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, H, W, C)).astype(np.uint8)


def region_apply(params, obs):
    """Known-answer agent: Q depends only on rows 2..4, cols 6..8 (action 0; action 1 constant)."""
    x = jnp.asarray(obs, jnp.float32) / 255.0
    r = x[:, 2:5, 6:9, :].sum((1, 2, 3))
    return jnp.stack([r, jnp.full_like(r, 0.5), -r * 0.1], axis=-1)


REGION = (slice(2, 5), slice(6, 9))
