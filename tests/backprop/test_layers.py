"""Layer taps by flax module name: names, default layer, errors, and dY/dA."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.backprop.layers import layer_calls, resolve_layer, tap
from tests._support.gradient_models import LinearConv, cleanrl_agent, init, obs


def nature():
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(3)
    x = jnp.zeros((1, 84, 84, 4))
    return m, m.init(jax.random.PRNGKey(0), x), x


def test_names_and_default_layer_nature():
    m, p, x = nature()
    names = [c.name for c in layer_calls(m.apply, p, x)]
    assert names[:5] == ["conv1", "conv1_norm", "conv2", "conv2_norm", "conv3"]
    assert resolve_layer(m.apply, p, x, None) == "conv3"
    assert resolve_layer(m.apply, p, x, "conv1") == "conv1"


def test_unknown_layer_lists_available():
    m, p, x = nature()
    with pytest.raises(SaliencyInputError, match=r"unknown layer 'conv9'.*conv1.*conv3.*fc1"):
        resolve_layer(m.apply, p, x, "conv9")


def test_cleanrl_auto_names_and_ambiguity():
    apply_fn, params = cleanrl_agent()
    x = jnp.zeros((1, 2, 16, 16))
    assert resolve_layer(apply_fn, params, x, None) == "Conv_2"
    assert resolve_layer(apply_fn, params, x, "Conv_0") == "Conv_0"
    # Dense_0 exists in the network, the actor and the critic: qualified names disambiguate
    with pytest.raises(SaliencyInputError, match="CleanRLActor/Dense_0"):
        resolve_layer(apply_fn, params, x, "Dense_0")


def test_tap_gradient_is_dy_da():
    """For conv -> flatten -> Dense, dy_a/dA is the Dense kernel column a."""
    m = LinearConv()
    x = jnp.asarray(obs((2, 8, 8, 2)))
    p = init(m, x.shape)
    f = tap(m.apply, "conv")
    y, A = f(p, x, 0.0)
    want = np.asarray(m.apply(p, x))   # another program (the tap adds eps): a Q near 0, to 1e-6 of the largest
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    eps = jnp.zeros(A.shape)
    g = jax.grad(lambda e: f(p, x, e)[0][:, 1].sum())(eps)
    W = np.asarray(p["params"]["q"]["kernel"])[:, 1].reshape(A.shape[1:])
    np.testing.assert_allclose(g, np.broadcast_to(W, A.shape), rtol=1e-6)


def test_plain_function_has_no_layers():
    with pytest.raises(SaliencyInputError, match="flax"):
        resolve_layer(lambda p, x: x.sum((1, 2)), None, jnp.zeros((1, 4, 4, 2)), None)
