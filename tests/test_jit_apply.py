"""Every method gives the same maps through a `jax.jit`-wrapped apply as through the plain one (issue 29.8a).

SBX stores `module.apply = jax.jit(module.apply)`; users jit their apply too. Flax's method
interceptor does not see module calls inside a jit that is already traced, so layer methods
failed with "no flax module call was seen". The ReLU rules (guided backprop, deconvnet) already
looked inside jit equations; both are checked here, on a jit called directly, on one called
inside a plain function, with the jit's cache warm (as after training), and on a copy of the jit
(SBX's `Model.load` gives one: it runs, but has lost the attribute `jax.eval_shape(fn)` reads).
"""
from __future__ import annotations

import copy
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.backprop.layers import layer_calls


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (4, 4), strides=(2, 2), name="conv1")(x / 255.0))
        x = nn.relu(nn.LayerNorm(name="conv2_norm")(nn.Conv(8, (3, 3), name="conv2")(x)))
        x = nn.relu(nn.Dense(16, name="fc")(x.reshape(x.shape[0], -1)))
        return nn.Dense(3, name="q")(x)


NET = Net()
X = np.random.default_rng(0).integers(0, 256, (3, 20, 20, 2)).astype(np.float32)
JITTED = jax.jit(NET.apply)


@functools.cache
def params():
    """The net's parameters, with the jit's cache made warm as SBX's is after training: once per
    process, when a test first asks (not at collection, in every xdist worker)."""
    p = jax.jit(NET.init)(jax.random.PRNGKey(0), X[:1])
    JITTED(p, X)
    return p

NESTED = jax.jit(lambda p, x: JITTED(p, x) * 1.0)


def inside_plain(p, x):
    return JITTED(p, x)


COPIED = copy.copy(JITTED)
APPLIES = {"jit": JITTED, "jit_in_plain_fn": inside_plain, "nested_jit": NESTED, "copied_jit": COPIED}
CASES = {
    "gradient": {}, "guided_backprop": {}, "deconvnet": {},
    "gradcam": {"layer": "conv2"}, "gradcam_pp": {"layer": "conv2"},
    "g1gradcam": {"layer": "conv2"}, "g2gradcam": {"layer": "conv1"},
    "guided_gradcam": {"layer": "conv2"}, "gradcam_default_layer": {},
    "gradcam_post_relu": {"layer": "conv2", "layer_activation": "post_relu"},
    "smoothgrad_guided": {"n_samples": 3, "rule": "guided", "key": jax.random.PRNGKey(0)},
    "ig_deconvnet": {"steps": 3, "rule": "deconvnet"},
    "occlusion": {"patch": 4, "stride": 4, "incremental": True},
}


def _maps(fn, case):
    method = case.split("_default")[0].split("_post")[0]
    method = {"smoothgrad_guided": "smoothgrad", "ig_deconvnet": "integrated_gradients"}.get(method, method)
    return np.asarray(jaxsal.explain(fn, params(), X, method=method, **CASES[case]))


EVERY_WRAP = {"gradient", "guided_backprop", "gradcam"}
"""Every case runs through the jit called directly in the fast loop; through the other two wraps,
one plain gradient, one ReLU rule and one layer method do (the rest are `slow` tests)."""


@pytest.mark.parametrize("case,wrap", [
    pytest.param(case, wrap, id=f"{case}-{wrap}",
                 marks=() if wrap == "jit" or case in EVERY_WRAP else pytest.mark.slow)
    for case in CASES for wrap in APPLIES])
def test_maps_through_a_jitted_apply_equal_the_plain_apply(case, wrap):
    want = _maps(NET.apply, case)
    got = _maps(APPLIES[wrap], case)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("wrap", list(APPLIES))
def test_layers_are_listed_through_a_jitted_apply(wrap):
    p, x = params(), jnp.asarray(X[:1])
    assert layer_calls(APPLIES[wrap], p, x) == layer_calls(NET.apply, p, x)
    assert [c.name for c in layer_calls(APPLIES[wrap], p, x)] == ["conv1", "conv2", "conv2_norm", "fc", "q"]


def test_a_copied_jit_keeps_the_affine_prefix_and_runs_the_metrics():
    """The copy has lost what jax.eval_shape reads, so the shape probes trace a call of it: IG's
    affine-prefix split is still found and a fidelity curve equals the plain apply's."""
    from jaxsal.backprop.prefix import split_affine
    with pytest.raises(AttributeError):
        jax.eval_shape(COPIED, params(), X[:1])
    assert split_affine(COPIED, params(), X.shape[1:]) is not None
    maps = _maps(NET.apply, "gradient")
    want = jaxsal.metrics.deletion(NET.apply, params(), X, maps, score="difference")
    got = jaxsal.metrics.deletion(COPIED, params(), X, maps, score="difference")
    assert got.keys() == want.keys() and got["auc"].shape == (len(X),)
    for k in want:
        if isinstance(want[k], str):
            assert got[k] == want[k], k
        else:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6, err_msg=k)
