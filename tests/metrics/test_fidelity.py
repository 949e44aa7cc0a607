"""Insertion / deletion: hand-computed toy cases, a per-step reference loop, substrates, bad input."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage

from jaxsal import SaliencyInputError
from jaxsal.metrics import deletion, gaussian_blur, insertion


def linear_apply(params, obs):
    """Q0 = sum of all pixels of all frames, Q1 = constant 1."""
    q0 = obs.reshape(obs.shape[0], -1).sum(-1)
    return jnp.stack([q0, jnp.ones_like(q0)], -1)


X = np.array([[1., 2.], [3., 4.]], np.float32)[None, :, :, None]     # (1, 2, 2, 1), Q0 = 10
MAP = np.array([[0.1, 0.4], [0.3, 0.2]], np.float32)[None]           # order: 2, 3, 4, 1


def test_insertion_hand_computed():
    r = insertion(linear_apply, None, X, MAP, pixels_per_step=1)
    np.testing.assert_allclose(r["curves"][0], [0, .2, .5, .9, 1.0], atol=1e-6)
    assert float(r["auc"][0]) == pytest.approx(2.6 / 5)
    adv = insertion(linear_apply, None, X, MAP, pixels_per_step=1, score="advantage")
    # Q0 - mean(Q0, 1) = (Q0 - 1) / 2 with Q0 = 0, 2, 5, 9, 10
    np.testing.assert_allclose(adv["curves"][0], [-.5, .5, 2., 4., 4.5], atol=1e-6)
    coarse = insertion(linear_apply, None, X, MAP, pixels_per_step=3)   # 4 px in steps of 3: 0, 3, 4
    np.testing.assert_allclose(coarse["curves"][0], [0, .9, 1.0], atol=1e-6)


def test_deletion_hand_computed_and_frames_move_together():
    r = deletion(linear_apply, None, X, MAP, pixels_per_step=1)
    np.testing.assert_allclose(r["curves"][0], [1, .8, .5, .1, 0], atol=1e-6)
    x2 = np.concatenate([X, 10 * X], -1)                                 # 2 frames, Q0 = 110
    r2 = deletion(linear_apply, None, x2, MAP, pixels_per_step=1)
    np.testing.assert_allclose(r2["curves"][0], [1, .8, .5, .1, 0], atol=1e-6)


def test_given_action_is_scored():
    r = insertion(linear_apply, None, X, MAP, pixels_per_step=1, actions=np.array([1]))
    np.testing.assert_allclose(r["curves"][0], 1.0, atol=1e-6)   # Q1 is constant


class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), (2, 2))(x / 255.0))
        return nn.Dense(3)(x.reshape(x.shape[0], -1)) + 2.0


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (5, 12, 12, 2)).astype(np.uint8)
    model = Tiny()
    params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 12, 12, 2)))
    maps = rng.random((5, 12, 12)).astype(np.float32)
    return model, params, obs, maps


def reference(apply_fn, params, obs, maps, sub, k, mode, score):
    """Straight from the definition: one forward pass per step, numpy ranking."""
    obs = np.asarray(obs, np.float32)
    out = []
    for x, m, s in zip(obs, maps, sub):
        q = np.asarray(apply_fn(params, x[None]))[0]
        a = int(q.argmax())
        order = np.argsort(-m.ravel(), kind="stable")
        steps = int(np.ceil(m.size / k))
        curve = []
        for t in range(steps + 1):
            top = np.zeros(m.size, bool)
            top[order[:t * k]] = True
            top = top.reshape(m.shape)[..., None]
            xt = np.where(top, x, s) if mode == "insertion" else np.where(top, s, x)
            qt = np.asarray(apply_fn(params, xt[None]))[0]
            curve.append(qt[a] / q[a] if score == "q_value" else qt[a] - qt.mean())
        out.append(curve)
    return np.array(out)


@pytest.mark.parametrize("mode", ["insertion", "deletion"])
@pytest.mark.parametrize("score", ["q_value", "advantage"])
def test_matches_reference_loop(tiny, mode, score):
    model, params, obs, maps = tiny
    fn = insertion if mode == "insertion" else deletion
    r = fn(model.apply, params, obs, maps, pixels_per_step=10, score=score, batch_size=20)
    ref = reference(model.apply, params, obs, maps, np.zeros_like(obs, np.float32), 10, mode, score)
    assert r["curves"].shape == (5, 16)
    np.testing.assert_allclose(r["curves"], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r["auc"], ref.mean(-1), rtol=1e-4, atol=1e-4)


def test_blur_substrate(tiny):
    model, params, obs, maps = tiny
    x = np.asarray(obs, np.float32)
    ref_blur = scipy.ndimage.gaussian_filter(x, sigma=(0, 1.5, 1.5, 0), mode="reflect")
    np.testing.assert_allclose(gaussian_blur(jnp.asarray(x), 1.5), ref_blur, rtol=1e-4, atol=1e-3)
    r = deletion(model.apply, params, obs, maps, substrate="blur", blur_sigma=1.5, pixels_per_step=16)
    ref = reference(model.apply, params, obs, maps, ref_blur, 16, "deletion", "q_value")
    np.testing.assert_allclose(r["curves"], ref, rtol=1e-4, atol=1e-4)


def test_random_substrate_deterministic_and_chunk_invariant(tiny):
    model, params, obs, maps = tiny
    k = jax.random.PRNGKey(3)
    a = insertion(model.apply, params, obs, maps, substrate="random", key=k, pixels_per_step=16)
    b = insertion(model.apply, params, obs, maps, substrate="random", key=k, pixels_per_step=16,
                  batch_size=10)
    c = insertion(model.apply, params, obs, maps, substrate="random", key=jax.random.PRNGKey(4),
                  pixels_per_step=16)
    np.testing.assert_allclose(a["curves"], b["curves"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a["curves"][:, 0], c["curves"][:, 0])
    np.testing.assert_allclose(a["curves"][:, -1], 1.0, atol=1e-5)      # everything inserted
    black = insertion(model.apply, params, obs, maps, pixels_per_step=16)
    assert not np.allclose(a["curves"][:, 0], black["curves"][:, 0])


def test_batched_equals_per_state_and_nchw(tiny):
    model, params, obs, maps = tiny
    full = insertion(model.apply, params, obs, maps, pixels_per_step=16)
    for i in range(2):
        one = insertion(model.apply, params, obs[i:i + 1], maps[i:i + 1], pixels_per_step=16)
        np.testing.assert_allclose(one["curves"][0], full["curves"][i], rtol=1e-5, atol=1e-6)
    nchw = insertion(lambda p, o: model.apply(p, jnp.transpose(o, (0, 2, 3, 1))), params,
                     np.transpose(obs, (0, 3, 1, 2)), maps, pixels_per_step=16, layout="NCHW")
    np.testing.assert_allclose(nchw["curves"], full["curves"], rtol=1e-5, atol=1e-6)


def test_faithful_map_beats_reversed_map():
    """On the linear model the map = pixel contribution is the best possible insertion order."""
    rng = np.random.default_rng(5)
    obs = rng.random((3, 10, 10, 2)).astype(np.float32) * 255
    good = obs.sum(-1)
    ins_good = insertion(linear_apply, None, obs, good, pixels_per_step=5)["auc"]
    ins_bad = insertion(linear_apply, None, obs, -good, pixels_per_step=5)["auc"]
    del_good = deletion(linear_apply, None, obs, good, pixels_per_step=5)["auc"]
    del_bad = deletion(linear_apply, None, obs, -good, pixels_per_step=5)["auc"]
    assert (np.asarray(ins_good) > np.asarray(ins_bad)).all()
    assert (np.asarray(del_good) < np.asarray(del_bad)).all()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(maps=np.zeros((5, 12, 11), np.float32)), "expected"),
    (dict(maps=np.zeros((4, 12, 12), np.float32)), "expected"),
    (dict(maps=np.full((5, 12, 12), np.nan, np.float32)), "NaN"),
    (dict(maps=np.zeros((5, 12, 12, 2), np.float32)), "per-frame"),
    (dict(substrate="grey"), "substrate"),
    (dict(score="softmax"), "score"),
    (dict(substrate="random"), "key"),
    (dict(pixels_per_step=0), "pixels_per_step"),
    (dict(actions=np.array([0, 1, 2, 3, 9])), "out of range"),
])
def test_bad_input(tiny, kwargs, msg):
    model, params, obs, maps = tiny
    kw = dict(maps=maps)
    kw.update(kwargs)
    m = kw.pop("maps")
    with pytest.raises(SaliencyInputError, match=msg):
        insertion(model.apply, params, obs, m, **kw)


def test_score_all_equals_single_scores(tiny):
    model, params, obs, maps = tiny
    both = deletion(model.apply, params, obs, maps, pixels_per_step=16, score="all")
    for score in ("q_value", "advantage"):
        one = deletion(model.apply, params, obs, maps, pixels_per_step=16, score=score)
        # another program: an advantage near 0 is compared to 1e-6 of the largest
        for k in ("curves", "auc"):
            want = np.asarray(one[k])
            np.testing.assert_allclose(both[score][k], want, rtol=1e-6, atol=1e-6 * np.abs(want).max(), err_msg=k)


# ----------------------------------------------------------------- targets: the curve follows the explanation's
S_IN = np.array([0., 2., 5., 9., 10.])       # pixel sum of X after inserting 0..4 pixels in MAP's order


def ac_apply(params, obs):
    """A linear actor-critic, (logits, value): logits (S / 10, 0.5, 0), V = S + 1, S = the pixel sum."""
    s = obs.reshape(obs.shape[0], -1).sum(-1)
    return jnp.stack([s / 10, jnp.full_like(s, 0.5), jnp.zeros_like(s)], -1), s + 1


def _softmax_row(logits, a):
    e = np.exp(np.asarray(logits, np.float64))
    return e[a] / e.sum()


def test_value_target_follows_v_not_the_greedy_logit():
    r = insertion(ac_apply, None, X, MAP, pixels_per_step=1, target="value")
    assert r["score"] == "ratio"                                          # V(x_t) / V(x), V(x) = 11
    np.testing.assert_allclose(r["curves"][0], (S_IN + 1) / 11, atol=1e-6)
    d = insertion(ac_apply, None, X, MAP, pixels_per_step=1, target="value", score="difference")
    np.testing.assert_allclose(d["curves"][0], S_IN, atol=1e-5)          # V(x_t) - V(black), V(black) = 1
    nz = deletion(ac_apply, None, X, MAP, pixels_per_step=1, target="value", score="normalized")
    np.testing.assert_allclose(nz["curves"][0], (10 - S_IN) / 10, atol=1e-6)   # 1 at x, 0 at black


@pytest.mark.parametrize("target", ["log_prob", "policy_logit"])
def test_policy_target_follows_the_action_probability(target):
    r = insertion(ac_apply, None, X, MAP, pixels_per_step=1, target=target)
    assert r["score"] == "raw" and int(r["actions"][0]) == 0               # argmax of logits (1, .5, 0) on x
    want = [_softmax_row([s / 10, 0.5, 0.0], 0) for s in S_IN]
    np.testing.assert_allclose(r["curves"][0], want, atol=1e-6)
    assert float(r["auc"][0]) == pytest.approx(np.mean(want), abs=1e-6)
    given = deletion(ac_apply, None, X, MAP, pixels_per_step=1, target=target, actions=np.array([2]))
    want = [_softmax_row([s / 10, 0.5, 0.0], 2) for s in 10 - S_IN]                    # deletion: S = 10, 8, 5, 1, 0
    np.testing.assert_allclose(given["curves"][0], want, atol=1e-6)


def test_q_target_on_an_actor_critic_dict_follows_the_probability():
    """A loader's actor-critic ({"logits", "value"}, no Q-values): q_chosen reads the logits, so the
    curve is pi(a|x_t), not the logit (defined only up to a per-state constant)."""
    ac_dict = lambda p, o: dict(zip(("logits", "value"), ac_apply(p, o)))
    r = insertion(ac_dict, None, X, MAP, pixels_per_step=1)
    np.testing.assert_allclose(r["curves"][0], [_softmax_row([s / 10, 0.5, 0.0], 0) for s in S_IN], atol=1e-6)
    assert r["score"] == "raw"
    with pytest.raises(SaliencyInputError, match="q_value"):
        insertion(ac_dict, None, X, MAP, pixels_per_step=1, score="q_value")


def test_q_action_scores_the_given_action_and_needs_one():
    q = insertion(linear_apply, None, X, MAP, pixels_per_step=1, target="q_action", actions=np.array([1]))
    np.testing.assert_allclose(q["curves"][0], 1.0, atol=1e-6)           # Q1 = 1 whatever is inserted
    with pytest.raises(SaliencyInputError, match="q_action.*actions"):
        insertion(linear_apply, None, X, MAP, pixels_per_step=1, target="q_action")


def test_ratio_of_a_score_near_or_below_zero_is_nan_with_a_warning():
    neg = lambda p, o: -linear_apply(p, o) + jnp.array([0.0, 2.0])       # Q = (-S, 1): argmax is 1 ... Q1 = 1
    low = lambda p, o: linear_apply(p, o) * jnp.array([1.0, 0.0]) + jnp.array([-9.95, -1.0])  # Q0(x) = 0.05
    with pytest.warns(RuntimeWarning, match="1 of 1 states.*difference"):
        r = insertion(low, None, X, MAP, pixels_per_step=1)              # Q0(black) / Q0(x) = -199
    assert np.isnan(r["auc"][0]) and np.isnan(r["curves"]).all()
    d = insertion(low, None, X, MAP, pixels_per_step=1, score="difference")
    np.testing.assert_allclose(d["curves"][0], S_IN, atol=1e-5)
    with pytest.warns(RuntimeWarning, match="q_value"):
        insertion(neg, None, X, MAP, pixels_per_step=1, target="q_action", actions=np.array([0]))  # Q0(x) < 0
    ok = insertion(neg, None, X, MAP, pixels_per_step=1)                  # argmax is Q1 = 1 > 0: defined
    np.testing.assert_allclose(ok["curves"][0], 1.0, atol=1e-6)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(target="value", score="q_value"), "ratio"),
    (dict(target="log_prob", score="advantage"), "advantage"),
    (dict(target="value", apply=linear_apply), "value"),
    (dict(target="nope"), "unknown target"),
])
def test_score_or_target_the_model_lacks(kwargs, msg):
    apply = kwargs.pop("apply", ac_apply)
    with pytest.raises(SaliencyInputError, match=msg):
        insertion(apply, None, X, MAP, pixels_per_step=1, **kwargs)


def test_all_lists_the_scores_of_the_target():
    q = deletion(linear_apply, None, X, MAP, pixels_per_step=1, score="all")
    assert set(q) == {"q_value", "advantage", "ratio", "normalized", "difference", "raw"}
    np.testing.assert_allclose(q["q_value"]["curves"], q["ratio"]["curves"])
    v = deletion(ac_apply, None, X, MAP, pixels_per_step=1, score="all", target="value")
    assert set(v) == {"ratio", "normalized", "difference", "raw"}
    np.testing.assert_allclose(v["raw"]["curves"][0], 11 - S_IN, atol=1e-5)


def test_a_callable_target_is_followed_raw():
    r = insertion(linear_apply, None, X, MAP, pixels_per_step=1, target=lambda out: out[:, 0] - 3.0)
    assert r["score"] == "raw"
    np.testing.assert_allclose(r["curves"][0], S_IN - 3.0, atol=1e-5)
    with pytest.warns(RuntimeWarning, match="callable"):
        nz = insertion(linear_apply, None, X, MAP, pixels_per_step=1, target=lambda out: out[:, 0] * 0.0,
                       score="normalized")                                 # 0 / 0 everywhere
    assert np.isnan(nz["auc"]).all()
