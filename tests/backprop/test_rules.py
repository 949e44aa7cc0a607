"""Guided / deconvnet ReLU rules via jaxpr rewriting: same forward, hand-derived backward."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.backprop.rules import count_relus, with_rule

# A 2-layer ReLU net with weights chosen so that backward signals of both signs reach the ReLUs.
W1 = np.array([[1.0, -2.0, 0.5], [0.5, 1.0, -1.0], [-1.0, 0.5, 2.0], [2.0, 1.0, 1.0]], np.float32)
W2 = np.array([1.0, -1.0, 2.0, -0.5], np.float32)


def net_jax_relu(x):
    return jax.nn.relu(x @ W1.T) @ W2


def net_bare_max(x):
    return jnp.maximum(x @ W1.T, 0.0) @ W2


def net_flax_relu(x):
    return nn.relu(x @ W1.T) @ W2


def net_bare_max_zero_first(x):
    """max(0, z), the zero as the first operand (a literal there, as jnp.maximum(0.0, z) traces)."""
    return jnp.maximum(0.0, x @ W1.T) @ W2


def reference(x, rule):
    """Backward by hand: R at the hidden ReLU output is W2; rule; then W1^T."""
    z = W1 @ x
    r = W2.copy()
    if rule == "plain":
        r_in = (z > 0) * r
    elif rule == "guided":
        r_in = (z > 0) * (r > 0) * r
    else:
        r_in = (r > 0) * r
    return W1.T @ r_in


X = np.array([[1.0, 0.5, -0.5], [-1.0, 1.0, 0.3], [0.2, -0.7, 1.0]], np.float32)


@pytest.mark.parametrize("net", [net_jax_relu, net_bare_max, net_bare_max_zero_first, net_flax_relu])
@pytest.mark.parametrize("rule", ["plain", "guided", "deconvnet"])
def test_rule_matches_hand_derived_backward(net, rule):
    f = with_rule(net, rule)
    for x in X:
        got = jax.grad(f)(jnp.asarray(x))
        np.testing.assert_allclose(got, reference(x, rule), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f(jnp.asarray(x)), net(jnp.asarray(x)), rtol=1e-6)


def test_guided_differs_from_plain_and_keeps_negative_input_gradients():
    g = [reference(x, "guided") for x in X]
    p = [reference(x, "plain") for x in X]
    assert not np.allclose(g, p)  # the test net really exercises the rule
    assert (np.concatenate(g) < 0).any()  # negative input gradients survive (W1 has signs)


def test_rule_composes_with_jit_and_vmap():
    f = with_rule(net_jax_relu, "guided")
    got = jax.jit(jax.vmap(jax.grad(f)))(jnp.asarray(X))
    want = np.stack([reference(x, "guided") for x in X])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_relu_inside_nested_jit_and_pytree_io():
    @jax.jit
    def inner(x):
        return jax.nn.relu(x @ W1.T)

    def f(d):
        return {"y": inner(d["x"]) @ W2}

    g = jax.grad(lambda x: with_rule(f, "deconvnet")({"x": x})["y"])(jnp.asarray(X[0]))
    np.testing.assert_allclose(g, reference(X[0], "deconvnet"), rtol=1e-6, atol=1e-6)


def test_only_relus_are_rewritten():
    assert count_relus(net_jax_relu, jnp.asarray(X[0])) == 1
    assert count_relus(lambda x: jnp.maximum(x, 1.0).sum() + jnp.maximum(x, x * 2).sum(),
                       jnp.asarray(X[0])) == 0
    # a non-ReLU max keeps its ordinary gradient
    f = with_rule(lambda x: jnp.maximum(x, 1.0).sum(), "guided")
    np.testing.assert_allclose(jax.grad(f)(jnp.array([2.0, 0.0])), [1.0, 0.0])


def test_flax_conv_model_relus_found():
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(3)
    x = jnp.zeros((1, 84, 84, 4))
    p = m.init(jax.random.PRNGKey(0), x)
    assert count_relus(m.apply, p, x) == 4
