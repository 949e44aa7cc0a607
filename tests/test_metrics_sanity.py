"""Cascading-randomisation sanity check: maps change under randomisation, same action and key
for every model, correct cascade, baselines, bad input. Uses test-local methods."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.networks import NatureDQN
from jaxsal import SaliencyInputError
from jaxsal.metrics import cascade, sanity_check
from jaxsal.registry import METHODS, register
from jaxsal.targets import get_target, resolve_actions

SEEN_ACTIONS = []


def _grad_map(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC",
              batch_size=None):
    """|d target / d obs| summed over frames (a plain gradient map for these tests)."""
    tgt = get_target(target)
    a = resolve_actions(tgt, apply_fn(params, obs), actions)
    SEEN_ACTIONS.append(np.asarray(a))
    g = jax.grad(lambda o: tgt.score(apply_fn(params, o), a).sum())(jnp.asarray(obs, jnp.float32))
    return jnp.abs(g).sum(-1)


def _noise_map(apply_fn, params, obs, *, target="q_chosen", actions=None, key=None, batch_size=None):
    """Depends only on the key: identical maps iff every model gets the same key."""
    return jax.random.uniform(key, np.shape(obs)[:3])


def _nan_map(apply_fn, params, obs, *, target="q_chosen", actions=None):
    return jnp.full(np.shape(obs)[:3], jnp.nan)


@pytest.fixture(scope="module", autouse=True)
def methods():
    names = {"_t_grad": _grad_map, "_t_noise": _noise_map, "_t_nan": _nan_map}
    for n, f in names.items():
        register(n)(f)
    yield
    for n in names:
        METHODS.pop(n, None)


@pytest.fixture(scope="module")
def dqn():
    model = NatureDQN(4)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4)))
    obs = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4)).astype(np.uint8)
    return model, params, obs


def test_randomisation_changes_gradient_map(dqn):
    model, params, obs = dqn
    SEEN_ACTIONS.clear()
    r = sanity_check(model, params, obs, method="_t_grad", key=jax.random.PRNGKey(1), return_maps=True)
    layers = ("q", "fc1", "conv3", "conv2", "conv1")
    assert list(r)[:5] == list(layers)
    for layer in layers:
        for m in ("spearman", "ssim", "hog"):
            v = np.asarray(r[layer][m])
            assert v.shape == (3,) and np.isfinite(v).all()
        assert np.asarray(r[layer]["spearman"]).mean() < 0.9, layer
        assert not np.allclose(r["maps"][layer], r["maps"]["original"])
    for b in ("random_uniform", "random_gaussian"):
        assert np.abs(np.asarray(r[b]["spearman"])).mean() < 0.1
    # every randomised model explained the original model's chosen action
    original = np.asarray(jnp.argmax(model.apply(params, obs), -1))
    assert len(SEEN_ACTIONS) == 6
    for a in SEEN_ACTIONS:
        np.testing.assert_array_equal(a, original)


def test_identity_reinit_gives_perfect_similarity(dqn):
    """init_fn returning the original weights: nothing changes, every similarity is 1."""
    model, params, obs = dqn
    r = sanity_check(lambda k: params, params, obs, method="_t_grad", layers=("q", "fc1"),
                     key=jax.random.PRNGKey(2), apply_fn=model.apply)
    for layer in ("q", "fc1"):
        for m in ("spearman", "ssim", "hog"):
            np.testing.assert_allclose(r[layer][m], 1.0, atol=1e-5)


def test_same_key_for_every_model(dqn):
    model, params, obs = dqn
    r = sanity_check(model, params, obs, method="_t_noise", layers=("q", "conv1"), key=jax.random.PRNGKey(3))
    for layer in ("q", "conv1"):
        np.testing.assert_allclose(r[layer]["spearman"], 1.0, atol=1e-5)
    assert np.asarray(r["random_uniform"]["spearman"]).max() < 0.2


def test_cascade_is_top_down_and_cumulative(dqn):
    model, params, _ = dqn
    fresh = model.init(jax.random.PRNGKey(9), jnp.zeros((1, 84, 84, 4)))
    steps = dict(cascade(params, fresh, ("q", "fc1", "conv3")))
    p = steps["conv3"]["params"]
    for name in ("q", "fc1", "conv3"):
        np.testing.assert_array_equal(p[name]["kernel"], fresh["params"][name]["kernel"])
    for name in ("conv1", "conv2"):
        np.testing.assert_array_equal(p[name]["kernel"], params["params"][name]["kernel"])
    np.testing.assert_array_equal(steps["q"]["params"]["fc1"]["kernel"], params["params"]["fc1"]["kernel"])


@pytest.mark.parametrize("kwargs, msg", [
    (dict(layers=("q", "fc9")), "fc9"),
    (dict(key=None), "key"),
    (dict(method="_t_nan"), "NaN"),
    (dict(method="nope"), "unknown method"),
    (dict(per_frame=True), "per_frame"),
])
def test_bad_input(dqn, kwargs, msg):
    model, params, obs = dqn
    kw = dict(method="_t_grad", key=jax.random.PRNGKey(0))
    kw.update(kwargs)
    with pytest.raises(SaliencyInputError, match=msg):
        sanity_check(model, params, obs[:1], **kw)


def test_init_fn_needs_apply_fn(dqn):
    model, params, obs = dqn
    with pytest.raises(SaliencyInputError, match="apply_fn"):
        sanity_check(lambda k: params, params, obs[:1], method="_t_grad", key=jax.random.PRNGKey(0))


def test_layer_groups_randomise_together():
    model = NatureDQN(3, layer_norm=True)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4)))
    fresh = jax.tree.map(lambda x: x + 1.0, params)
    (label, p), = cascade(params, fresh, (("fc1", "fc1_norm"),))
    assert label == "fc1"
    np.testing.assert_array_equal(p["params"]["fc1_norm"]["LayerNorm_0"]["scale"],
                                  fresh["params"]["fc1_norm"]["LayerNorm_0"]["scale"])
    np.testing.assert_array_equal(p["params"]["conv1_norm"]["LayerNorm_0"]["scale"],
                                  params["params"]["conv1_norm"]["LayerNorm_0"]["scale"])
