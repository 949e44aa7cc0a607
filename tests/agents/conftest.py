"""Fixtures of the agents tests."""
import pytest


@pytest.fixture(scope="module")
def probe_setup():
    """(env, probe states, model, params): 6 probe states of the fake env and a MinAtar DQN."""
    import jax
    import jax.numpy as jnp

    from jaxsal_agents.networks import MinAtarDQN
    from jaxsal_agents.snapshots import probe_states
    from tests._support.snapshot_training import env_fn

    env = env_fn(seed=1)
    probe = probe_states(env, 6, steps=10)
    model = MinAtarDQN(env.num_actions, env.obs_shape[-1])
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + env.obs_shape))
    return env, probe, model, params
