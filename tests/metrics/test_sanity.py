"""Cascading-randomisation sanity check: maps change under randomisation, same action and key
for every model, correct cascade, baselines, bad input. Uses test-local methods."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn

from jaxsal_agents.networks import NatureDQN, _Norm
from jaxsal import SaliencyInputError
from jaxsal.metrics import cascade, sanity_check
from jaxsal.caching import cached_jit
from jaxsal.registry import METHODS, register
from jaxsal.targets import get_target, resolve_actions

SEEN_ACTIONS = []


def _abs_grad(apply_fn, target):
    tgt = get_target(target)

    def f(params, obs, a):
        g = jax.grad(lambda o: tgt.score(apply_fn(params, o), a).sum())(jnp.asarray(obs, jnp.float32))
        return jnp.abs(g).sum(-1)
    return f


def _grad_map(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC",
              batch_size=None):
    """|d target / d obs| summed over frames (a plain gradient map for these tests; compiled once
    per model and shape, as jaxsal's methods are: op by op, each randomised model costs seconds)."""
    tgt = get_target(target)
    a = resolve_actions(tgt, apply_fn(params, obs), actions)
    SEEN_ACTIONS.append(np.asarray(a))
    return cached_jit(_abs_grad, apply_fn, target)(params, obs, a)


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


class _TinyLN(nn.Module):
    """Nature-DQN layout in miniature (conv1 -> conv1_norm -> ReLU -> fc1 -> fc1_norm -> ReLU -> q)."""

    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        x = nn.relu(_Norm(True, name="conv1_norm")(nn.Conv(4, (3, 3), (2, 2), name="conv1")(x)))
        x = nn.relu(_Norm(True, name="fc1_norm")(nn.Dense(16, name="fc1")(x.reshape(x.shape[0], -1))))
        return nn.Dense(3, name="q")(x)


@pytest.fixture(scope="module")
def ln_dqn():
    """A small LayerNorm DQN whose norms are far from identity (as after training)."""
    model = _TinyLN()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 12, 12, 2)))
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 3.0 + 0.5 if "_norm" in jax.tree_util.keystr(path) else x, params)
    obs = np.random.default_rng(1).integers(0, 256, (2, 12, 12, 2)).astype(np.uint8)
    return model, params, obs


def test_group_norms_pairs_each_layer_with_its_norm(ln_dqn):
    model, params, _ = ln_dqn
    from jaxsal.metrics import group_norms
    assert group_norms(params, ("q", "fc1", "conv1")) == ("q", ("fc1", "fc1_norm"), ("conv1", "conv1_norm"))
    assert group_norms(params, ("q", "fc1"), norms="keep") == ("q", "fc1")
    with pytest.raises(SaliencyInputError, match="norms"):
        group_norms(params, ("q",), norms="reset")
    # re-drawn from its initialiser, a flax LayerNorm is the identity affine map in every draw
    (_, p), = cascade(params, model.init(jax.random.PRNGKey(5), jnp.zeros((1, 12, 12, 2))),
                      group_norms(params, ("fc1",)))
    np.testing.assert_array_equal(p["params"]["fc1_norm"]["LayerNorm_0"]["scale"], 1.0)
    np.testing.assert_array_equal(p["params"]["fc1_norm"]["LayerNorm_0"]["bias"], 0.0)
    assert float(p["params"]["conv1_norm"]["LayerNorm_0"]["scale"][0]) == 3.5


@pytest.mark.slow
def test_sanity_norms_option_and_draws(ln_dqn):
    model, params, obs = ln_dqn
    kw = dict(method="_t_grad", key=jax.random.PRNGKey(4), metrics=("spearman",), return_maps=True)
    auto = sanity_check(model, params, obs, layers=("q", "fc1"), **kw)
    explicit = sanity_check(model, params, obs, layers=("q", ("fc1", "fc1_norm")), norms="keep", **kw)
    kept = sanity_check(model, params, obs, layers=("q", "fc1"), norms="keep", **kw)
    np.testing.assert_array_equal(auto["maps"]["fc1"], explicit["maps"]["fc1"])
    assert np.abs(np.asarray(auto["maps"]["fc1"]) - np.asarray(kept["maps"]["fc1"])).max() > 0
    other = sanity_check(model, params, obs, layers=("q", "fc1"), draw=1, **kw)
    np.testing.assert_array_equal(auto["maps"]["original"], other["maps"]["original"])
    assert np.abs(np.asarray(auto["maps"]["q"]) - np.asarray(other["maps"]["q"])).max() > 0
    with pytest.raises(SaliencyInputError, match="draw"):
        sanity_check(model, params, obs, layers=("q",), draw=-1, **kw)


def test_each_step_explains_the_cumulative_top_down_cascade(ln_dqn):
    """sanity_check's map at step i is the method on `cascade`'s model i (layers[0..i] re-drawn, each
    with its norm), with the original action: a step randomising only its own layer, or the layers
    below it, gives other maps. `model` is an init_fn returning fixed fresh weights, so no key matters."""
    from jaxsal.metrics import group_norms
    model, params, obs = ln_dqn
    fresh = model.init(jax.random.PRNGKey(5), jnp.zeros((1, 12, 12, 2)))
    fresh = jax.tree.map(lambda v: np.asarray(v) + 0.3, fresh)   # norms away from identity too
    layers = ("q", "fc1", "conv1")
    r = sanity_check(lambda k: fresh, params, obs, method="_t_grad", layers=layers, key=jax.random.PRNGKey(3),
                     apply_fn=model.apply, metrics=("spearman",), return_maps=True)
    a = np.asarray(jnp.argmax(model.apply(params, obs), -1))
    steps = cascade(params, fresh, group_norms(params, layers))
    assert [label for label, _ in steps] == list(layers)
    for label, p in steps:
        np.testing.assert_allclose(r["maps"][label], _grad_map(model.apply, p, obs, actions=a), rtol=1e-5,
                                   atol=1e-7, err_msg=label)
    for x, y in (("original", "q"), ("q", "fc1"), ("fc1", "conv1")):   # each step changes the maps
        assert np.abs(np.asarray(r["maps"][x]) - np.asarray(r["maps"][y])).max() > 1e-4, (x, y)


def test_given_original_maps_are_used_as_computed(dqn):
    """original= (the caller's maps of the same states) gives the same result as recomputing them;
    maps of other states are refused."""
    model, params, obs = dqn
    kw = dict(method="_t_grad", layers=("q", "conv1"), key=jax.random.PRNGKey(6), return_maps=True)
    plain = sanity_check(model, params, obs, **kw)
    SEEN_ACTIONS.clear()
    given = sanity_check(model, params, obs, original=plain["maps"]["original"], **kw)
    assert len(SEEN_ACTIONS) == 2                  # the two randomised models only
    for layer in ("q", "conv1", "random_uniform"):
        for m in ("spearman", "ssim", "hog"):
            np.testing.assert_array_equal(given[layer][m], plain[layer][m])
    with pytest.raises(SaliencyInputError, match="2 maps for 3 states"):
        sanity_check(model, params, obs, original=plain["maps"]["original"][:2], **kw)
    with pytest.raises(SaliencyInputError, match="shape"):
        sanity_check(model, params, obs, original=plain["maps"]["original"][:, :40], **kw)


SLOW = pytest.mark.slow  # 3-7 s each; the fast loop keeps one draws path of each kind below


@pytest.mark.parametrize("method, opts", [
    pytest.param("rise", dict(n_masks=16, batch_size=8), marks=SLOW),
    pytest.param("lime", dict(n_samples=12, segmentation_options={"n_segments": 6}), marks=SLOW),
    ("lime", dict(n_samples=12, segmentation="felzenszwalb")),   # segments on the host: an eager vmap
    pytest.param("scorecam", dict(layer="conv1"), marks=SLOW),
    ("occlusion", dict(patch=4, stride=4)),                   # the incremental pass
    pytest.param("noise_sensitivity", dict(radius=2, stride=4), marks=SLOW),  # the perturbation draws path: occlusion's
    ("_t_grad", {}),
])
def test_several_draws_in_one_call_equal_draw_by_draw(ln_dqn, method, opts):
    """draws=(...) gives, per draw, what draw=d gives (the batched path to float rounding), and
    the draws really differ (so a mix-up of draws would show)."""
    model, params, obs = ln_dqn
    kw = dict(method=method, layers=("q", "fc1", "conv1"), key=jax.random.PRNGKey(8),
              metrics=("spearman",), return_maps=True, **opts)
    together = sanity_check(model, params, obs, draws=(2, 0, 5), **kw)
    assert list(together) == [2, 0, 5]
    for d in (2, 0, 5):
        alone = sanity_check(model, params, obs, draw=d, **kw)
        assert set(together[d]) == set(alone)
        for label in ("q", "fc1", "conv1", "original"):
            np.testing.assert_allclose(together[d]["maps"][label], alone["maps"][label], rtol=1e-5, atol=1e-6)
        for label in ("random_uniform", "random_gaussian"):
            np.testing.assert_array_equal(together[d][label]["spearman"], alone[label]["spearman"])
    assert np.abs(np.asarray(together[2]["maps"]["fc1"]) - np.asarray(together[5]["maps"]["fc1"])).max() > 1e-3


@pytest.mark.parametrize("kwargs, msg", [
    (dict(draws=(1, 1)), "repeated"),
    (dict(draws=()), "empty"),
    (dict(draws=3), "sequence"),
    (dict(draws=(0, -1)), "draws"),
    (dict(draws=(0, 1), draw=2), "either draw"),
])
def test_bad_draws(dqn, kwargs, msg):
    model, params, obs = dqn
    with pytest.raises(SaliencyInputError, match=msg):
        sanity_check(model, params, obs[:1], method="_t_grad", key=jax.random.PRNGKey(0), **kwargs)


class _ManyDraws:
    """range(n)'s len (an OverflowError past 2**63, as range's) whose iteration fails after 1,000 draws, so
    a check that lists the draws before bounding them fails here instead of running for hours."""

    def __init__(self, n, sized=True):
        self.n, self.sized = n, sized

    def __len__(self):
        if not self.sized:
            raise TypeError("no len")
        return len(range(self.n))

    def __iter__(self):
        for d in range(1000):
            yield d
        raise AssertionError("the draws were listed before their number was checked")


@pytest.mark.parametrize("draws", [_ManyDraws(10 ** 12), _ManyDraws(2 ** 64), _ManyDraws(10 ** 12, sized=False)],
                         ids=["10**12", "2**64", "an iterator"])
def test_draws_beyond_memory_are_refused_before_any_is_drawn(dqn, monkeypatch, draws):
    """Each draw holds a copy of the weights at once: before, range(10**12) listed the indices, then
    exhausted memory (range(2**64) never ended). Now one error, at once, saying how many fit (here
    a machine whose free memory holds 20 copies: 10 draws; an iterator is read no further than 11)."""
    from jaxsal.metrics import sanity as S
    model, params, obs = dqn
    per_copy = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    monkeypatch.setattr(S, "free_memory_bytes", lambda: 20 * per_copy)
    with pytest.raises(SaliencyInputError, match=r"draws holds .* pass at most \d+ per call"):
        sanity_check(model, params, obs[:1], method="_t_grad", key=jax.random.PRNGKey(0), draws=draws)


def test_the_draws_bound_is_half_the_free_memory_in_weight_copies(dqn, monkeypatch):
    from jaxsal.metrics import sanity as S
    model, params, obs = dqn
    per_copy = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    monkeypatch.setattr(S, "free_memory_bytes", lambda: 6 * per_copy + 1)
    assert S.draws_that_fit(params) == 3
    kw = dict(method="_t_grad", key=jax.random.PRNGKey(0), layers=("q",), metrics=("spearman",))
    with pytest.raises(SaliencyInputError, match="draws holds 4 draws.*pass at most 3 per call"):
        sanity_check(model, params, obs[:1], draws=range(4), **kw)
    assert sorted(sanity_check(model, params, obs[:1], draws=range(3), **kw)) == [0, 1, 2]
    monkeypatch.setattr(S, "free_memory_bytes", lambda: None)  # unknown: no bound
    assert S.draws_that_fit(params) is None


def test_draws_are_vmapped_for_perturbation_methods_only(ln_dqn, monkeypatch):
    """A perturbation method's draws of a step share one vmapped program; a gradient method's go one
    at a time (its backward through re-drawn convolutions is slower vmapped)."""
    from jaxsal.metrics import sanity as S
    model, params, obs = ln_dqn
    seen, real = [], S._vmapped
    monkeypatch.setattr(S, "_vmapped", lambda f, stack, x, p: seen.append(1) or real(f, stack, x, p))
    kw = dict(layers=("q", "fc1"), key=jax.random.PRNGKey(8), metrics=("spearman",), draws=(0, 1))
    sanity_check(model, params, obs, method="gradient", **kw)
    assert seen == []
    sanity_check(model, params, obs, method="rise", n_masks=8, **kw)
    assert seen == [1, 1]                              # one program per cascade step
