"""Agent networks: output shapes, exact layer names, input scaling and bad-input errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal_agents import AgentInputError, networks

KEY = jax.random.PRNGKey(0)
OBS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4)), jnp.uint8)


def test_nature_dqn_layer_names_and_shape():
    model = networks.NatureDQN(6)
    params = model.init(KEY, OBS)
    assert list(params["params"]) == ["conv1", "conv2", "conv3", "fc1", "q"]
    assert params["params"]["conv1"]["kernel"].shape == (8, 8, 4, 32)
    assert params["params"]["fc1"]["kernel"].shape == (3136, 512)
    assert model.apply(params, OBS).shape == (3, 6)


def test_uint8_and_float_inputs_give_same_output():
    model = networks.NatureDQN(4, layer_norm=True)
    params = model.init(KEY, OBS)
    np.testing.assert_allclose(model.apply(params, OBS), model.apply(params, OBS.astype(jnp.float32)),
                               rtol=1e-6, atol=1e-6)


def test_dueling_merge():
    model = networks.DuelingDQN(4)
    params = model.init(KEY, OBS)
    out = model.apply(params, OBS)
    assert out["q"].shape == (3, 4) and out["value"].shape == (3,) and out["advantage"].shape == (3, 4)
    expected = out["value"][:, None] + out["advantage"] - out["advantage"].mean(-1, keepdims=True)
    np.testing.assert_allclose(out["q"], expected, rtol=1e-5, atol=1e-5)


def test_actor_critic_outputs():
    model = networks.ActorCritic(6)
    out = model.apply(model.init(KEY, OBS), OBS)
    assert out["logits"].shape == (3, 6) and out["value"].shape == (3,)


@pytest.mark.parametrize("cls", [networks.MinAtarDQN, networks.MinAtarActorCritic])
def test_minatar_networks(cls):
    obs = jnp.zeros((5, 10, 10, 6))
    model = cls(4, 6)
    out = model.apply(model.init(KEY, obs), obs)
    q = out if not isinstance(out, dict) else out["logits"]
    assert q.shape == (5, 4)
    assert "conv1" in model.init(KEY, obs)["params"]


@pytest.mark.slow
def test_split_attention_agent():
    obs = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 84, 84, 10)), jnp.uint8)
    model = networks.SplitAttentionDQN(4, lstm_features=32)
    params = model.init(KEY, obs)
    out = model.apply(params, obs)
    assert out["q"].shape == (2, 4)
    for k in ("value_attention", "advantage_attention"):
        assert out[k].shape == (2, 10)
        np.testing.assert_allclose(out[k].sum(1), 1.0, rtol=1e-5)
    names = set(params["params"])
    assert {"conv1", "conv2", "conv3", "fc1", "value_lstm1", "value_lstm2", "advantage_lstm1",
            "advantage_lstm2", "value_attention", "advantage_attention", "q"} <= names
    # every frame of the stack goes through the same shared CNN: one conv1 kernel with 1 input channel
    assert params["params"]["conv1"]["kernel"].shape == (8, 8, 1, 32)


@pytest.mark.parametrize("obs, match", [
    (jnp.zeros((84, 84, 4)), "batch axis"),
    (jnp.zeros((2, 4, 84, 84)), "channel-first"),
    (jnp.zeros((2, 80, 80, 4)), r"\(N, 84, 84, C\)"),
    (jnp.zeros((2, 84, 84, 3)), "3 channels"),
    (jnp.zeros((2, 84, 84, 4), jnp.complex64), "dtype"),
])
def test_bad_input_is_one_clear_error(obs, match):
    model = networks.NatureDQN(4)
    params = model.init(KEY, OBS)
    with pytest.raises(AgentInputError, match=match):
        model.apply(params, obs)
