"""Saliency in a loss: `jax.grad` of a function of the maps with respect to `params` works for
every gradient and CAM method (what saliency-guided training needs), equals plain double
backpropagation written out by hand (vanilla gradient, Grad-CAM), and is the same with the
strided-conv fast path on and off (so the rule's backward is itself differentiable)."""
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.registry import SPECS
from tests._support.conformance import A, C, H, MODEL, PARAMS, W  # the conformance CNN

N = 2
OBS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (N, H, W, C)), jnp.uint8)
OPTIONS = {"smoothgrad": {"n_samples": 3, "key": jax.random.PRNGKey(1)},
           "integrated_gradients": {"steps": 3}}
FAST = {"gradient", "guided_backprop", "gradcam", "smoothgrad"}  # one per rule and engine; the rest slow (~3 CPU s each)
METHODS = [m if m in FAST else pytest.param(m, marks=pytest.mark.slow)
           for m in sorted(m for m in SPECS if SPECS[m].share_key is not None) + ["smoothgrad", "integrated_gradients"]]


def _weights(shape):
    return jnp.asarray(np.random.default_rng(2).normal(size=shape), jnp.float32)


def _param_grad(method, **kw):
    def loss(p):
        maps = jaxsal.explain(MODEL.apply, p, OBS, method=method, **{**OPTIONS.get(method, {}), **kw})
        return (maps * _weights(maps.shape)).sum()
    return jax.grad(loss)(PARAMS)


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(l)) for l in jax.tree.leaves(tree)])


@pytest.mark.parametrize("method", METHODS)
def test_param_gradient_of_every_gradient_and_cam_method_is_finite_and_fast_path_free(method):
    g = _flat(_param_grad(method))
    assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, method
    if "fast_conv" in inspect.signature(jaxsal.registry.get_method(method)).parameters:
        plain = _flat(_param_grad(method, fast_conv=False))
        np.testing.assert_allclose(g, plain, rtol=1e-4, atol=1e-6 * np.abs(plain).max(), err_msg=method)


def _actions():
    return jnp.argmax(MODEL.apply(PARAMS, OBS), -1)


def test_vanilla_gradient_param_gradient_equals_double_backprop_by_hand():
    a = _actions()

    def ref_maps(p):
        x = OBS.astype(jnp.float32)
        g = jax.grad(lambda xx: MODEL.apply(p, xx)[jnp.arange(N), a].sum())(x)
        return g.sum(-1)

    want = _flat(jax.grad(lambda p: (ref_maps(p) * _weights((N, H, W))).sum())(PARAMS))
    got = _flat(_param_grad("gradient"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_gradcam_param_gradient_equals_double_backprop_by_hand():
    a = _actions()

    def ref_maps(p):
        x = OBS.astype(jnp.float32) / 255.0
        c1 = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID").apply({"params": p["params"]["conv1"]}, x))
        conv2 = nn.Conv(4, (2, 2), (1, 1), padding="VALID")
        act = conv2.apply({"params": p["params"]["conv2"]}, c1)

        def head(A_):
            return nn.Dense(A).apply({"params": p["params"]["q"]}, nn.relu(A_).reshape(N, -1))[jnp.arange(N), a].sum()

        g = jax.grad(head)(act)
        w = g.mean(axis=(1, 2))
        cam = jax.nn.relu(jnp.einsum("nhwk,nk->nhw", act, w))
        return jax.image.resize(cam, (N, H, W), method="bilinear", antialias=False)

    want = _flat(jax.grad(lambda p: (ref_maps(p) * _weights((N, H, W))).sum())(PARAMS))
    got = _flat(_param_grad("gradcam", layer="conv2"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_param_gradient_under_jit_equals_eager():
    f = jax.jit(lambda p: _flat_j(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam",
                                                                     layer="conv2").sum())(p)))
    eager = _flat(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam", layer="conv2").sum())(PARAMS))
    np.testing.assert_allclose(np.asarray(f(PARAMS)), eager, rtol=1e-5, atol=1e-7 * np.abs(eager).max())


def _flat_j(tree):
    return jnp.concatenate([jnp.ravel(l) for l in jax.tree.leaves(tree)])
