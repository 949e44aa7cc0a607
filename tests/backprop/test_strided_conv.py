"""jaxsal.backprop.strided_conv: the space-to-depth + matmul conv equals lax.conv, and fast_apply equals the
plain apply_fn for outputs, input gradients and jaxsal methods (gradient, CAM, occlusion)."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxsal
from jaxsal.backprop.strided_conv import conv_eligible, conv_hybrid, conv_s2d, fast_apply


def _ref_conv_numpy(x, k, s, pad):
    """Straight loop over output positions: the definition of a cross-correlation."""
    x = np.pad(x, ((0, 0), pad[0], pad[1], (0, 0)))
    n, h, w, c = x.shape
    kh, kw, _, o = k.shape
    oh, ow = (h - kh) // s[0] + 1, (w - kw) // s[1] + 1
    y = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * s[0]:i * s[0] + kh, j * s[1]:j * s[1] + kw, :]
            y[:, i, j] = np.tensordot(patch, k, axes=([1, 2, 3], [0, 1, 2]))
    return y


@pytest.mark.parametrize("hw,c,o,k,s,pad", [
    ((84, 84), 4, 8, (8, 8), (4, 4), "VALID"),      # Nature conv1
    ((20, 20), 5, 6, (4, 4), (2, 2), "VALID"),      # Nature conv2
    ((9, 9), 3, 4, (3, 3), (1, 1), "VALID"),        # Nature conv3
    ((13, 11), 2, 3, (5, 3), (3, 2), "VALID"),      # kernel not a multiple of stride, ragged
    ((10, 10), 2, 3, (3, 3), (2, 2), "SAME"),
    ((7, 9), 2, 3, (2, 4), (2, 3), [(1, 2), (0, 1)]),
])
def test_conv_s2d_matches_reference_and_lax(hw, c, o, k, s, pad):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, *hw, c)).astype(np.float32)
    ker = rng.normal(size=(*k, c, o)).astype(np.float32)
    y = np.asarray(conv_s2d(jnp.asarray(x), jnp.asarray(ker), s, pad,
                            precision=lax.Precision.HIGHEST))
    pads = lax.padtype_to_pads(hw, k, s, pad) if isinstance(pad, str) else pad
    np.testing.assert_allclose(y, _ref_conv_numpy(x, ker, s, pads), rtol=1e-4, atol=1e-4)
    y_lax = lax.conv_general_dilated(x, ker, s, pad, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=lax.Precision.HIGHEST)
    np.testing.assert_allclose(y, np.asarray(y_lax), rtol=1e-4, atol=1e-4)
    # input gradient (the transpose path) agrees as well
    w = jnp.asarray(rng.normal(size=y.shape).astype(np.float32))
    g1 = jax.grad(lambda v: (conv_s2d(v, ker, s, pad, lax.Precision.HIGHEST) * w).sum())(x)
    g2 = jax.grad(lambda v: (lax.conv_general_dilated(
        v, ker, s, pad, dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=lax.Precision.HIGHEST) * w).sum())(x)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-4, atol=1e-4)


class _Odd(nn.Module):
    """Convs fast_apply must leave alone (dilated, grouped) next to ones it rewrites."""

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(8, (8, 8), (4, 4), padding="VALID", name="c1")(x))
        x = nn.relu(nn.Conv(8, (3, 3), (1, 1), kernel_dilation=2, name="dil")(x))
        x = nn.relu(nn.Conv(8, (3, 3), (2, 2), feature_group_count=2, name="grp")(x))
        x = nn.relu(nn.Conv(6, (3, 3), (2, 2), padding="SAME", use_bias=False, name="same")(x))
        return nn.Dense(3, name="q")(x.reshape(x.shape[0], -1))


def _nature(layer_norm=False):
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(5, layer_norm=layer_norm)
    x = np.random.default_rng(1).integers(0, 256, (6, 84, 84, 4), dtype=np.uint8)
    params = m.init(jax.random.PRNGKey(3), x[:1])
    # larger weights than the init so that ReLUs flip and errors would show
    params = jax.tree.map(lambda a: a * 2.0, params)
    return m.apply, params, x


@pytest.mark.parametrize("which", ["nature", pytest.param("nature_ln", marks=pytest.mark.slow), "odd"])  # ln: 6 s
def test_fast_apply_equals_plain_forward_and_gradient(which):
    if which == "odd":
        m = _Odd()
        x = np.random.default_rng(2).integers(0, 256, (4, 84, 84, 4), dtype=np.uint8)
        apply_fn, params = m.apply, m.init(jax.random.PRNGKey(0), x[:1])
    else:
        apply_fn, params, x = _nature(which == "nature_ln")
    fast = fast_apply(apply_fn)
    assert fast is fast_apply(apply_fn)  # memoised: compiled caches keyed on apply_fn still hit
    assert fast_apply(fast) is fast
    xf = jnp.asarray(x, jnp.float32)
    a, b = apply_fn(params, xf), fast(params, xf)
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)

    def g(f):
        return jax.jit(jax.grad(lambda v: f(params, v)[:, 0].sum()))(xf)

    ga, gb = np.asarray(g(apply_fn)), np.asarray(g(fast))
    assert np.abs(ga).max() > 0
    # the matmul backward sums in another order: ~2e-7 of the largest value seen (level 0 and default)
    np.testing.assert_allclose(gb, ga, rtol=1e-5, atol=1e-5 * np.abs(ga).max())


def _compiled_convs(fn, x):
    """Convolutions XLA actually runs for fn's compiled input gradient (after dead-code removal)."""
    txt = jax.jit(jax.grad(lambda v: fn(v)[:, 0].sum())).lower(x).compile().as_text()
    return len(re.findall(r"convolution\(", txt))


def test_fast_apply_really_rewrites_the_strided_convs():
    apply_fn, params, x = _nature()
    xf = jnp.asarray(x[:2], jnp.float32)
    # forward: every conv stays a conv (XLA's / YNNPACK's forward conv is the fast one)
    for f in (apply_fn, fast_apply(apply_fn), fast_apply(apply_fn, min_stride=1)):
        assert str(jax.make_jaxpr(f)(params, xf)).count("conv_general_dilated") == 3
    # input gradient: 3 forward convs + 3 transposed convs plainly; fast_apply's backward of the
    # strided conv1/conv2 is matmuls (conv3, stride 1, keeps its conv unless min_stride=1)
    assert _compiled_convs(lambda v: apply_fn(params, v), xf) == 6
    assert _compiled_convs(lambda v: fast_apply(apply_fn)(params, v), xf) == 4
    assert _compiled_convs(lambda v: fast_apply(apply_fn, min_stride=1)(params, v), xf) == 3


def test_conv_hybrid_equals_lax_conv_values_and_both_gradients():
    rng = np.random.default_rng(3)
    for (n, h, w, c), (kh, kw, o), s, pad in [((2, 84, 84, 4), (8, 8, 32), (4, 4), "VALID"),
                                              ((3, 20, 21, 5), (4, 3, 7), (2, 3), "SAME"),
                                              ((2, 9, 9, 6), (3, 3, 4), (1, 1), ((1, 0), (2, 1)))]:
        x = jnp.asarray(rng.standard_normal((n, h, w, c)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((kh, kw, c, o)), jnp.float32)

        def ref(x, k):
            return lax.conv_general_dilated(x, k, s, pad, dimension_numbers=("NHWC", "HWIO", "NHWC"))

        def hyb(x, k):
            return conv_hybrid(x, k, s, pad)

        y = ref(x, k)
        np.testing.assert_allclose(hyb(x, k), y, rtol=1e-6, atol=1e-5)
        dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
        for want, got in zip(jax.vjp(ref, x, k)[1](dy), jax.vjp(hyb, x, k)[1](dy)):
            scale = float(jnp.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_conv_eligible_rejects_what_it_cannot_do():
    x = jnp.zeros((1, 8, 8, 2), jnp.float32)
    assert conv_eligible(nn.Conv(3, (2, 2), (2, 2)), x)
    assert not conv_eligible(nn.Conv(3, (2, 2), (1, 1)), x)
    assert conv_eligible(nn.Conv(3, (2, 2), (1, 1)), x, min_stride=1)
    assert not conv_eligible(nn.Conv(3, (2, 2), (2, 2), kernel_dilation=2), x)
    assert not conv_eligible(nn.Conv(3, (2, 2), (2, 2), feature_group_count=2), x)
    assert not conv_eligible(nn.Conv(3, (2, 2), (2, 2), padding="CIRCULAR"), x)
    assert not conv_eligible(nn.Conv(3, (2, 2), (2, 2)), x.astype(jnp.bfloat16))
    assert not conv_eligible(nn.Conv(3, (2,), (2,)), x[0])


@pytest.mark.parametrize("method,kw", [
    ("gradient", {}),
    pytest.param("guided_backprop", {}, marks=pytest.mark.slow),
    ("gradcam", {}),
    pytest.param("gradcam_pp", {}, marks=pytest.mark.slow),
    pytest.param("integrated_gradients", {"steps": 4}, marks=pytest.mark.slow),
    ("occlusion", {"patch": 8, "stride": 8}),
    pytest.param("occlusion", {"patch": 8, "stride": 8, "incremental": False},
                 marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_methods_through_fast_apply_equal_plain(method, kw):
    apply_fn, params, x = _nature()
    x = x[:3]
    slow = {} if method == "occlusion" else {"fast_conv": False}   # the plain side with no strided-conv rewrite
    plain = np.asarray(jaxsal.explain(apply_fn, params, x, method=method, **kw, **slow))
    fast = np.asarray(jaxsal.explain(fast_apply(apply_fn), params, x, method=method, **kw))
    assert np.abs(plain).max() > 0
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5 * np.abs(plain).max())
