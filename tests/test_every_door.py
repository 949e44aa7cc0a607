"""Every entry point checks the same things: a method function called directly
(`jaxsal.gradcam(...)`) resolves the model's declared layout and refuses frames on the wrong
pixel scale exactly as `jaxsal.explain` does (the checks live in jaxsal.checks.check_call)."""
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.agent_spec import DeclaredFn
from jaxsal.errors import SaliencyInputError
from jaxsal.registry import FRONT_DEFAULTS, METHODS, STOCHASTIC
from tests._support.conformance import example


class ChannelFirst(nn.Module):
    """A CleanRL-style Q-network: channel-first uint8 frames, divided by 255 inside."""

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
        x = nn.relu(nn.Conv(4, (4, 4), (2, 2), padding="VALID", name="conv")(x))
        return nn.Dense(3, name="q")(x.reshape((x.shape[0], -1)))


@pytest.fixture(scope="module")
def agent():
    m = ChannelFirst()
    obs = np.random.default_rng(0).integers(0, 256, (2, 4, 16, 16), dtype=np.uint8)
    params = m.init(jax.random.PRNGKey(0), obs)
    return DeclaredFn(m.apply, layout="NCHW", pixels="uint8"), params, obs




@pytest.mark.parametrize("name", sorted(m for m in METHODS if METHODS[m].__module__.startswith("jaxsal.")))
def test_a_method_called_directly_refuses_frames_divided_by_255(agent, name):
    fn, params, obs = agent
    kw = {"key": jax.random.PRNGKey(0)} if name in STOCHASTIC else {}
    with pytest.raises(SaliencyInputError, match="0..255 scale"):
        METHODS[name](fn, params, obs.astype(np.float32) / 256.0, **kw)


@pytest.mark.parametrize("name", ["gradient", "gradcam", "occlusion", "rise"])  # one of each family
def test_a_method_called_directly_takes_the_declared_layout(agent, name):
    fn, params, obs = agent
    kw = {k: v for k, v in example(name).items() if k != "layer"}  # its conformance case (and key)
    direct = METHODS[name](fn, params, obs, **kw)
    front = jaxsal.explain(fn, params, obs, method=name, **kw)
    assert direct.shape == front.shape == (2, 16, 16)
    np.testing.assert_allclose(np.asarray(direct), np.asarray(front), rtol=1e-6, atol=1e-7)
    with pytest.raises(SaliencyInputError, match="channel-first"):
        METHODS[name](fn, params, np.transpose(obs, (0, 2, 3, 1)), **kw)


def test_the_pixel_check_is_skipped_under_jit_not_failed(agent):
    fn, params, obs = agent
    f = jax.jit(lambda o: jaxsal.gradient(fn, params, o))
    assert f(obs.astype(np.float32)).shape == (2, 16, 16)


def test_front_defaults_are_explains_own():
    sig = inspect.signature(jaxsal.explain).parameters
    assert {k: sig[k].default for k in FRONT_DEFAULTS} == FRONT_DEFAULTS
