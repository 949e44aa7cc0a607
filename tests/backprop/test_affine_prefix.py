"""The affine-prefix fast path of IG and SmoothGrad (jaxsal.backprop.prefix / pathavg): the split
is found where it should be and nowhere else, and the maps equal the plain path's."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxsal
from jaxsal.targets import get_target
from jaxsal.backprop.pathavg import interpolated_gradient
from jaxsal.backprop.prefix import split_affine

H, W, C, A = 16, 16, 2, 3


class Scaled(nn.Module):
    """x / 255 - 0.5 -> strided conv -> ReLU -> conv -> ReLU -> dense (prefix: scale + conv1)."""
    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0 - 0.5
        x = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(4, (2, 2), (1, 1), padding="VALID", name="conv2")(x))
        return nn.Dense(A, name="q")(x.reshape(x.shape[0], -1))


class NonlinearFirst(nn.Module):
    """tanh of the input before any conv: no affine prefix worth splitting (fallback)."""
    @nn.compact
    def __call__(self, obs):
        x = jnp.tanh(jnp.asarray(obs, jnp.float32) / 128.0 - 1.0)
        x = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        return nn.Dense(A, name="q")(x.reshape(x.shape[0], -1))


class LayerNormed(nn.Module):
    """conv -> LayerNorm -> ReLU (PQN style): the prefix ends inside the LayerNorm."""
    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        x = nn.relu(nn.LayerNorm()(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x)))
        return nn.Dense(A, name="q")(x.reshape(x.shape[0], -1))


def _functional_nchw(params, x):
    """A functional channel-first model (as ported torch code): transpose-free NCHW convs."""
    h = lax.conv_general_dilated(x / 255.0, params["k1"], (2, 2), "VALID",
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h + params["b1"][None, :, None, None])
    return h.reshape((x.shape[0], -1)) @ params["w"]


def _functional_params():
    rng = np.random.default_rng(1)
    return {"k1": jnp.asarray(rng.normal(0, 0.3, (4, C, 3, 3)), jnp.float32),
            "b1": jnp.asarray(rng.normal(0, 0.1, (4,)), jnp.float32),
            "w": jnp.asarray(rng.normal(0, 0.1, (4 * 7 * 7, A)), jnp.float32)}


def _flax(module):
    return module.apply, module.init(jax.random.PRNGKey(0), jnp.zeros((1, H, W, C)))


def _obs(n=3, layout="NHWC", seed=0):
    shape = (n, H, W, C) if layout == "NHWC" else (n, C, H, W)
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, shape), jnp.uint8)


def test_split_finds_the_affine_prefix_and_reproduces_the_model():
    for fn, p, row in [(*_flax(Scaled()), (H, W, C)), (*_flax(LayerNormed()), (H, W, C)),
                       (_functional_nchw, _functional_params(), (C, H, W))]:
        sp = split_affine(fn, p, row)
        assert sp is not None and sp.costly == 1
        x = jnp.asarray(_obs(4, "NHWC" if row[-1] == C else "NCHW"), jnp.float32)
        np.testing.assert_allclose(sp.rest(p, sp.prefix(p, x)), fn(p, x), rtol=1e-5, atol=1e-5)
        u = sp.prefix(p, x)  # affine: the prefix of a mix is the mix of the prefixes
        mix = sp.prefix(p, 0.25 * x + 0.75 * x[::-1])
        for a, b, m in zip(u, sp.prefix(p, x[::-1]), mix):
            np.testing.assert_allclose(m, 0.25 * a + 0.75 * b, rtol=1e-5, atol=1e-4)


def test_no_split_without_a_useful_affine_prefix():
    fn, p = _flax(NonlinearFirst())
    assert split_affine(fn, p, (H, W, C)) is None           # first op nonlinear
    relu_first = lambda q, x: fn(q, jax.nn.relu(x - 100.0))  # noqa: E731
    assert split_affine(relu_first, p, (H, W, C)) is None
    assert split_affine(lambda q, x: x.sum((1, 2)) * 2.0, p, (H, W, C)) is None  # no conv/matmul
    assert split_affine(lambda q, x: fn(q, x).sum(), p, (H, W, C)) is None  # no batch axis out


def test_a_product_or_quotient_of_the_input_ends_the_prefix():
    """x * x and c / x are not affine in x (only a product with one input-dependent factor, or a quotient
    by a constant, is): a conv after them is no prefix to split, however affine the rest looks."""
    fn, p = _flax(Scaled())
    assert split_affine(lambda q, x: fn(q, x * x / 255.0), p, (H, W, C)) is None
    assert split_affine(lambda q, x: fn(q, 255.0 / (x + 1.0)), p, (H, W, C)) is None
    sp = split_affine(lambda q, x: fn(q, x * 2.0 / 3.0), p, (H, W, C))  # constant factors keep it
    assert sp is not None and sp.costly == 1


IG = ("integrated_gradients", {"steps": 5, "baseline": np.full((H, W, C), 40.0, np.float32)})
IG_GUIDED = ("integrated_gradients", {"steps": 5, "rule": "guided", "baseline": "uniform",
                                      "key": jax.random.PRNGKey(3)})
SG = ("smoothgrad", {"n_samples": 5, "key": jax.random.PRNGKey(0)})
SG_GUIDED = ("smoothgrad", {"n_samples": 5, "key": jax.random.PRNGKey(0), "rule": "guided"})
SG_VAR = ("smoothgrad", {"n_samples": 5, "key": jax.random.PRNGKey(0), "variant": "vargrad"})
_SLOW = pytest.mark.slow  # ~5 CPU s each; the fast loop keeps one case per model
CASES = [("scaled", *IG), ("scaled", *SG), ("layernorm", *SG_GUIDED), ("nchw", *IG), ("nonlinear_first", *SG)] + [
    pytest.param(*c, marks=_SLOW) for c in [("scaled", *IG_GUIDED), ("scaled", *SG_GUIDED), ("scaled", *SG_VAR),
                                            ("layernorm", *IG), ("nchw", *SG_GUIDED), ("nonlinear_first", *IG)]]


def _same(fast, plain):
    fast, plain = np.asarray(fast), np.asarray(plain)
    assert np.abs(plain).max() > 0
    np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=1e-4 * np.abs(plain).max())


@pytest.mark.parametrize("model,method,kw", CASES)
def test_fast_maps_equal_the_plain_path(model, method, kw):
    layout = "NCHW" if model == "nchw" else "NHWC"
    fn, p = {"scaled": lambda: _flax(Scaled()), "layernorm": lambda: _flax(LayerNormed()),
             "nchw": lambda: (_functional_nchw, _functional_params()),
             "nonlinear_first": lambda: _flax(NonlinearFirst())}[model]()
    kw = dict(kw)
    if layout == "NCHW" and isinstance(kw.get("baseline"), np.ndarray):
        kw["baseline"] = kw["baseline"].transpose(2, 0, 1)
    obs = _obs(3, layout)
    plain = jaxsal.explain(fn, p, obs, method=method, layout=layout, fast_prefix=False, **kw)
    fast = jaxsal.explain(fn, p, obs, method=method, layout=layout, **kw)
    _same(fast, plain)


def _conv_batches(jaxpr, strides, found):
    """Batch sizes of every conv_general_dilated with these strides, in nested jaxprs too."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated" \
                and tuple(eqn.params["window_strides"]) == strides:
            found.append(eqn.invars[0].aval.shape[0])
        for v in eqn.params.values():
            sub = getattr(v, "jaxpr", v)
            if hasattr(sub, "eqns"):
                _conv_batches(sub, strides, found)
    return found


def test_fast_path_runs_the_prefix_per_state_not_per_step():
    fn, p = _flax(Scaled())
    x = jnp.asarray(_obs(2), jnp.float32)
    al, wt = jnp.linspace(0.1, 1.0, 8), jnp.full((8,), 1 / 8)
    tgt, acts = get_target("q_chosen"), jnp.zeros((2,), jnp.int32)

    def batches(fast):
        closed = jax.make_jaxpr(lambda xx: interpolated_gradient(
            fn, tgt, p, jnp.zeros_like(xx), xx, al, wt, acts, fast_prefix=fast))(x)
        return set(_conv_batches(closed.jaxpr, (2, 2), []))

    assert batches(False) == {16}       # conv1 on every interpolated input
    assert batches(True) == {2}         # conv1 on the end points (and its transpose) only


def test_fast_prefix_is_an_option_of_ig_and_smoothgrad_only():
    from jaxsal.registry import method_options
    assert method_options("integrated_gradients")["fast_prefix"] is True
    assert method_options("smoothgrad")["fast_prefix"] is True
    fn, p = _flax(Scaled())
    out = jaxsal.explain(fn, p, _obs(2), method=["integrated_gradients", "gradient"], steps=2,
                         fast_prefix=False)
    assert set(out) == {"integrated_gradients", "gradient"}
    with pytest.raises(jaxsal.SaliencyInputError, match="fast_prefix"):
        jaxsal.explain(fn, p, _obs(2), method="gradient", fast_prefix=False)


SHIPPED_CASES = [  # IG with a baseline in the fast loop; the other three (~10 CPU s each) are slow
    pytest.param("integrated_gradients", {"steps": 3, "baseline": np.full((84, 84, 4), 20.0, np.float32)},
                 id="ig"),
    pytest.param("integrated_gradients", {"steps": 3, "rule": "guided"}, id="ig_guided", marks=pytest.mark.slow),
    pytest.param("smoothgrad", {"n_samples": 3, "key": jax.random.PRNGKey(0)}, id="smoothgrad",
                 marks=pytest.mark.slow),
    pytest.param("smoothgrad", {"n_samples": 3, "key": jax.random.PRNGKey(0), "rule": "guided"},
                 id="smoothgrad_guided", marks=pytest.mark.slow)]


@pytest.mark.parametrize("method,kw", SHIPPED_CASES)
def test_shipped_nature_cnn_fast_equals_plain(method, kw):
    """The shipped Breakout agent (Nature CNN with LayerNorm): prefix x/255 -> conv1 -> bias."""
    jaxsal_agents = pytest.importorskip("jaxsal_agents")
    ag = jaxsal_agents.load("breakout")
    sp = split_affine(ag.apply_fn, ag.params, (84, 84, 4))
    assert sp is not None and sp.costly == 1
    obs = np.random.default_rng(0).integers(0, 256, (2, 84, 84, 4), dtype=np.uint8)
    plain = jaxsal.explain(ag.apply_fn, ag.params, obs, method=method, fast_prefix=False, **kw)
    _same(jaxsal.explain(ag.apply_fn, ag.params, obs, method=method, **kw), plain)
