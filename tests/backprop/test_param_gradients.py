"""Saliency in a loss: `jax.grad` of a function of the maps with respect to `params` works for
every gradient and CAM method (what saliency-guided training needs) and is the same with the
strided-conv fast path on and off (so the rule's backward is itself differentiable). Every
gradient and CAM method, SmoothGrad, Integrated Gradients and occlusion have their maps and
parameter gradients compared with the method written out by hand in plain jax (one table)."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.registry import SPECS
from tests._support.conformance import MODEL, PARAMS, C, H, W  # the conformance CNN

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


# ---------------------------------------------------------------- references by hand
# The conformance CNN written out in plain jax (lax convolutions, a matmul head), its ReLUs
# replaceable by ones with the guided or deconvnet backward, and every method's maps written
# from its definition on top: no jaxsal code.
def _relu(rule):
    """max(x, 0) whose backward is plain (1[x>0] R), guided (1[x>0] 1[R>0] R) or deconvnet (1[R>0] R)."""
    if rule == "plain":
        return jax.nn.relu

    @jax.custom_vjp
    def relu(x):
        return jnp.maximum(x, 0.0)

    def bwd(x, r):
        keep = (r > 0) & (x > 0) if rule == "guided" else r > 0
        return (jnp.where(keep, r, 0.0),)

    relu.defvjp(lambda x: (relu(x), x), bwd)
    return relu


def _conv(p, name, x, stride):
    q = p["params"][name]
    return jax.lax.conv_general_dilated(x, q["kernel"], (stride, stride), "VALID",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC")) + q["bias"]


def _conv2(p, x, relu):
    """The pre-activation output of "conv2" (the CAM layer) for float observations x (N, H, W, C)."""
    return _conv(p, "conv2", relu(_conv(p, "conv1", x / 255.0, 2)), 1)


def _head(p, A, relu, a):
    """Q of actions a from conv2's output A, summed over the batch."""
    q = p["params"]["q"]
    h = relu(A).reshape(A.shape[0], -1)
    return (h @ q["kernel"] + q["bias"])[jnp.arange(A.shape[0]), a].sum()


def _q(p, x, relu=jax.nn.relu):
    A = _conv2(p, x, relu)
    q = p["params"]["q"]
    return relu(A).reshape(A.shape[0], -1) @ q["kernel"] + q["bias"]


def _grad_x(p, x, a, rule="plain"):
    relu = _relu(rule)
    return jax.grad(lambda xx: _head(p, _conv2(p, xx, relu), relu, a))(x)


def _cam(weights, rule="plain"):
    """CAM maps ReLU(sum_k w_k A^k) at input size, w = weights(A, g), g = dQ_a/dA through `rule` ReLUs."""
    def maps(p, x, a):
        A = _conv2(p, x, jax.nn.relu)
        g = jax.grad(lambda AA: _head(p, AA, _relu(rule), a))(A)
        cam = jax.nn.relu(jnp.einsum("nhwk,nk->nhw", A, weights(A, g)))
        return jax.image.resize(cam, (x.shape[0], H, W), method="bilinear", antialias=False)
    return maps


def _safe_div(num, den):
    """num / den, 0 where den == 0 (with a finite gradient there)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _gradcam_pp_weights(A, g):
    """Chattopadhyay 2018: alpha = g^2 / (2 g^2 + sum_ab A_ab g^3), w_k = sum_ij alpha_ij ReLU(g_ij)."""
    alpha = _safe_div(g ** 2, 2 * g ** 2 + A.sum(axis=(1, 2), keepdims=True) * g ** 3)
    return (alpha * jax.nn.relu(g)).sum(axis=(1, 2))


def _xgradcam_weights(A, g):
    """Fu 2020: w_k = sum_ij A_ij g_ij / (sum_ab A_ab + 1e-7)."""
    return (A * g).sum(axis=(1, 2)) / (A.sum(axis=(1, 2)) + 1e-7)


def _per_max(m):
    mx = m.max(axis=(1, 2), keepdims=True)
    return _safe_div(m, mx)


def _g1(p, x, a):
    """G1Grad-CAM: Grad-CAM with guided-ReLU gradients, each map divided by its max."""
    return _per_max(_cam(lambda A, g: g.mean(axis=(1, 2)), "guided")(p, x, a))


def _times_guided(cam):
    """max(cam, 0) * max(guided backprop, 0), summed over channels."""
    def maps(p, x, a):
        c = jax.nn.relu(cam(p, x, a))
        return (c[..., None] * jax.nn.relu(_grad_x(p, x, a, "guided"))).sum(-1)
    return maps


def _smoothgrad(p, x, a):
    """Mean gradient over 3 copies x_i + N(0, s_i^2), s_i = 0.15 (max x_i - min x_i), noise of state i,
    sample j from fold_in(fold_in(key, i), j)."""
    key = OPTIONS["smoothgrad"]["key"]
    s = 0.15 * (x.max(axis=(1, 2, 3)) - x.min(axis=(1, 2, 3)))
    eps = jnp.stack([jnp.stack([jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, i), j), x.shape[1:])
                                for j in range(3)]) for i in range(x.shape[0])])
    xs = x[:, None] + eps * s[:, None, None, None, None]
    return jnp.mean(jnp.stack([_grad_x(p, xs[:, j], a) for j in range(3)]), 0).sum(-1)


def _integrated_gradients(p, x, a):
    """Right Riemann sum of 3 steps from the constant baseline x0 = 30 (the black one would leave the
    bias-free CNN's ReLU pattern, hence its gradient, the same along the path):
    (x - x0) * mean_k dQ/dx(x0 + k/3 (x - x0)), k = 1..3."""
    x0 = jnp.full_like(x, 30.0)
    return ((x - x0) * jnp.mean(jnp.stack([_grad_x(p, x0 + k / 3 * (x - x0), a) for k in (1, 2, 3)]), 0)).sum(-1)


def _occlusion(p, x, a):
    """1 - Q_a(x with a black 4x4 patch) on a 4x4 grid of patch positions, resized bilinearly."""
    ii, jj = jnp.arange(H)[:, None], jnp.arange(W)[None, :]
    rows = []
    for gy in range(4):
        for gx in range(4):
            m = ((ii >= 4 * gy) & (ii < 4 * gy + 4) & (jj >= 4 * gx) & (jj < 4 * gx + 4))[None, :, :, None]
            rows.append(1.0 - _q(p, jnp.where(m, 0.0, x))[jnp.arange(x.shape[0]), a])
    grid = jnp.stack(rows, 1).reshape(x.shape[0], 4, 4)
    return jax.image.resize(grid, (x.shape[0], H, W), method="bilinear", antialias=False)


GRADCAM = _cam(lambda A, g: g.mean(axis=(1, 2)))
REFERENCES = {  # method -> (its options, maps(params, float obs, actions) by hand)
    "gradient": ({}, lambda p, x, a: _grad_x(p, x, a).sum(-1)),
    "grad_x_input": ({}, lambda p, x, a: (x * _grad_x(p, x, a)).sum(-1)),
    "guided_backprop": ({}, lambda p, x, a: _grad_x(p, x, a, "guided").sum(-1)),
    "deconvnet": ({}, lambda p, x, a: _grad_x(p, x, a, "deconvnet").sum(-1)),
    "gradcam": ({"layer": "conv2"}, GRADCAM),
    "gradcam_pp": ({"layer": "conv2"}, _cam(_gradcam_pp_weights)),
    "xgradcam": ({"layer": "conv2"}, _cam(_xgradcam_weights)),
    "g1gradcam": ({"layer": "conv2"}, _g1),
    "g2gradcam": ({"layer": "conv2"}, _times_guided(_g1)),
    "guided_gradcam": ({"layer": "conv2"}, _times_guided(GRADCAM)),
    "smoothgrad": ({}, _smoothgrad),
    "integrated_gradients": ({"baseline": np.full((H, W, C), 30.0, np.float32)}, _integrated_gradients),
    "occlusion": ({"patch": 4, "stride": 4}, _occlusion),
}
# the fast tier keeps one case of each kind (the rest run with the slow tests): `make test` stays under 8 minutes
FAST_REF = {"gradient", "g2gradcam", "occlusion"}


def _case(m):
    return pytest.param(m, marks=[] if m in FAST_REF else [pytest.mark.slow])


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(want).max() > 0, f"{what}: all zero, tests nothing"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("method", [_case(m) for m in REFERENCES])
def test_maps_equal_the_method_written_out_by_hand(method):
    options, ref = REFERENCES[method]
    got = jaxsal.explain(MODEL.apply, PARAMS, OBS, method=method, **{**OPTIONS.get(method, {}), **options})
    _close(got, ref(PARAMS, OBS.astype(jnp.float32), _actions()), f"{method} maps")


@pytest.mark.parametrize("method", [_case(m) for m in REFERENCES])
def test_param_gradient_equals_the_method_written_out_by_hand(method):
    options, ref = REFERENCES[method]
    a, x, w = _actions(), OBS.astype(jnp.float32), _weights((N, H, W))
    want = _flat(jax.grad(lambda p: (ref(p, x, a) * w).sum())(PARAMS))
    _close(_flat(_param_grad(method, **options)), want, f"{method} parameter gradient")


def test_param_gradient_under_jit_equals_eager():
    f = jax.jit(lambda p: _flat_j(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam",
                                                                     layer="conv2").sum())(p)))
    eager = _flat(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam", layer="conv2").sum())(PARAMS))
    np.testing.assert_allclose(np.asarray(f(PARAMS)), eager, rtol=1e-5, atol=1e-7 * np.abs(eager).max())


def _flat_j(tree):
    return jnp.concatenate([jnp.ravel(l) for l in jax.tree.leaves(tree)])
