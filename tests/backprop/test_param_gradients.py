"""Saliency in a loss: `jax.grad` of a function of the maps with respect to `params` works for
every gradient and CAM method (what saliency-guided training needs) and is the same with the
strided-conv fast path on and off (so the rule's backward is itself differentiable). Every
method (the gradient and CAM families, SmoothGrad, Integrated Gradients, Score-CAM and the
perturbation methods: occlusion, noise sensitivity with both scores, SARFA, RISE, LIME) has its
maps and parameter gradients compared with the method written out by hand in plain jax (one
table). Every method is differentiable in params almost everywhere: the explained action (an
argmax) is fixed, SARFA's dP > 0 threshold and Score-CAM's min-max are kinks, and LIME's
segmentation depends on the frames alone."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.ndimage import gaussian_filter
from skimage.segmentation import slic
from skimage.transform import resize

import jaxsal
from jaxsal.perturbation import lime_samples  # LIME's documented draws from `key` (no option takes samples)
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


# ---- perturbation methods: the perturbed inputs built on host from the definitions (they do not depend
# on params; Score-CAM's masks, from the activations, do), every model call on them in plain jax
def _q_of(p, xs):
    """Q of perturbed inputs xs (N, P, H, W, C): (N, P, A)."""
    return _q(p, xs.reshape((-1,) + xs.shape[2:])).reshape(xs.shape[:2] + (-1,))


def _chosen(qs, a):
    """qs (N, P, A) at each state's action a (N,): (N, P)."""
    return jnp.take_along_axis(qs, a[:, None, None], -1)[..., 0]


def _centres(stride):
    """Greydanus' grid: centres 0, stride, 2 stride, ... < H (and W), row-major."""
    return [(ci, cj) for ci in range(0, H, stride) for cj in range(0, W, stride)]


def _to_input(grid_scores, stride):
    """(N, gy * gx) scores -> (N, gy, gx) grid resized bilinearly (half-pixel centres) to (H, W)."""
    g = grid_scores.reshape(grid_scores.shape[0], len(range(0, H, stride)), len(range(0, W, stride)))
    return jax.image.resize(g, (g.shape[0], H, W), method="bilinear", antialias=False)


NOISE = {"radius": 1.5, "stride": 4, "blur_sigma": 2.0}


def _noise_sensitivity(score):
    """Greydanus 2018: M = the 5-pixel disk dy^2 + dx^2 <= 1 at each grid centre blurred with a Gaussian of
    sigma `radius` (scipy, reflect), divided by its max; x' = x (1 - M) + blur(x, blur_sigma) M, blurred
    per stacked frame; score 1/2 ||Q(x) - Q(x')||^2 ("output_l2") or 1 - softmax(Q(x'))_a ("chosen_action")."""
    ii, jj = np.mgrid[:H, :W]

    def disk(ci, cj):
        m = gaussian_filter(((ii - ci) ** 2 + (jj - cj) ** 2 <= 1).astype(np.float64), NOISE["radius"], mode="reflect")
        return m / m.max()

    def maps(p, x, a):
        xn = np.asarray(x, np.float64)
        blurred = gaussian_filter(xn, (0, NOISE["blur_sigma"], NOISE["blur_sigma"], 0), mode="reflect")
        M = np.stack([disk(ci, cj) for ci, cj in _centres(NOISE["stride"])])[None, :, :, :, None]
        xs = jnp.asarray(xn[:, None] * (1 - M) + blurred[:, None] * M, jnp.float32)
        q1 = _q_of(p, xs)
        if score == "output_l2":
            s = 0.5 * ((_q(p, x)[:, None] - q1) ** 2).sum(-1)
        else:
            s = 1.0 - _chosen(jax.nn.softmax(q1, -1), a)
        return _to_input(s, NOISE["stride"])
    return maps


def _sarfa(p, x, a):
    """Puri 2020, Paper B's disk: x' = x with the pixels dy^2 + dx^2 <= 2^2 of each centre (stride 2) set
    to 0 in every frame; dP = p_a - p'_a, p = softmax(Q); p_rem = p over the other actions, renormalised;
    K = 1 / (1 + KL(p_rem || p'_rem)); S = 2 K dP / (K + dP) where dP > 0, else 0 (a hard threshold,
    but S is continuous there, 0 on both sides: differentiable in params except on dP = 0)."""
    ii, jj = np.mgrid[:H, :W]
    keep = np.stack([(ii - ci) ** 2 + (jj - cj) ** 2 > 4 for ci, cj in _centres(2)])[None, :, :, :, None]
    pr0, pr1 = jax.nn.softmax(_q(p, x), -1)[:, None], jax.nn.softmax(_q_of(p, jnp.where(keep, x[:, None], 0.0)), -1)
    dp = _chosen(pr0, a) - _chosen(pr1, a)
    rest = jnp.arange(pr1.shape[-1])[None, None, :] != a[:, None, None]
    r0 = jnp.where(rest, pr0, 0.0) / (1.0 - _chosen(pr0, a))[..., None]
    r1 = jnp.where(rest, pr1, 0.0) / (1.0 - _chosen(pr1, a))[..., None]
    kl = jnp.where(rest, r0 * (jnp.log(jnp.where(rest, r0, 1.0)) - jnp.log(jnp.where(rest, r1, 1.0))), 0.0).sum(-1)
    k = 1.0 / (1.0 + kl)
    return _to_input(jnp.where(dp > 0, _safe_div(2 * k * dp, jnp.where(dp > 0, k + dp, 1.0)), 0.0), 2)


RISE = {"n_masks": 12, "grid": 4, "p_keep": 0.5}


def _rise_masks():
    """Petsiuk's masks: grid x grid cells kept with probability p_keep, resized bilinearly (skimage, reflect)
    to (grid + 1) ceil(H / grid) px, shifted by 0 .. cell - 1 px per axis and cropped to (H, W)."""
    rng, g, cell = np.random.default_rng(3), RISE["grid"], -(-H // RISE["grid"])
    bits = rng.random((RISE["n_masks"], g, g)) < RISE["p_keep"]
    shifts = rng.integers(0, cell, (RISE["n_masks"], 2))
    return np.stack([resize(b.astype(np.float64), ((g + 1) * cell,) * 2, order=1, mode="reflect",
                            anti_aliasing=False)[sy:sy + H, sx:sx + W] for b, (sy, sx) in zip(bits, shifts)])


def _rise(p, x, a):
    """Petsiuk 2018: S = sum_i Q_a(x M_i) M_i / (n_masks p_keep), black fill."""
    M = jnp.asarray(_rise_masks(), jnp.float32)
    s = _chosen(_q_of(p, x[:, None] * M[None, :, :, :, None]), a)
    return jnp.einsum("ni,ihw->nhw", s, M) / (RISE["n_masks"] * RISE["p_keep"])


LIME = {"n_samples": 24, "segmentation": "slic", "segmentation_options": {"n_segments": 6},
        "key": jax.random.PRNGKey(4)}


def _lime(p, x, a):
    """Ribeiro 2016 as lime_image: SLIC superpixels of the stack scaled to [0, 1] (compactness 10, sigma 0.25,
    the frames as channels), samples z in {0, 1}^d (jaxsal.perturbation.lime_samples, the draws the method
    documents it makes from `key`), off superpixels black, weights sqrt(exp(-dist^2 / 0.25^2)) with dist the
    cosine distance of z to all-ones; a weighted ridge (alpha 1, intercept) on Q_a, each pixel its segment's
    coefficient. The segmentation is not differentiable (nor a function of params); the fit is linear in Q."""
    out = []
    for i, xi in enumerate(np.asarray(x, np.float64)):
        labels = slic(xi / 255.0, n_segments=LIME["segmentation_options"]["n_segments"], compactness=10.0,
                      sigma=0.25, start_label=0, channel_axis=-1)
        seg = np.unique(labels, return_inverse=True)[1].reshape(H, W)
        d = seg.max() + 1
        z = np.asarray(lime_samples(LIME["key"], LIME["n_samples"], d), np.float64)
        y = _chosen(_q_of(p, jnp.asarray(xi[None, None] * z[:, seg][None, ..., None], jnp.float32)), a[i:i + 1])[0]
        w = np.sqrt(np.exp(-(1.0 - np.sqrt(z.sum(1) / d)) ** 2 / 0.25 ** 2))
        zc = z - w @ z / w.sum()
        yc = y - (w * y).sum() / w.sum()
        beta = jnp.linalg.solve(jnp.asarray(zc.T @ (w[:, None] * zc) + np.eye(d), jnp.float32),
                                jnp.asarray(zc.T * w, jnp.float32) @ yc)
        out.append(beta[seg])
    return jnp.stack(out)


def _aligned(n, size):
    """Sample positions, their two neighbours and weights of 1-D linear interpolation from n to `size`
    samples with aligned corners (output i samples input i (n - 1) / (size - 1))."""
    src = np.arange(size) * (n - 1) / (size - 1)
    i0 = np.minimum(np.floor(src).astype(int), n - 1)
    return i0, np.minimum(i0 + 1, n - 1), (src - i0).astype(np.float32)


def _scorecam(p, x, a):
    """Wang 2020 as pytorch-grad-cam: each channel of conv2's output A upsampled bilinearly (align_corners)
    to (H, W), min-max normalised (+1e-8) to M_k; s_k = Q_a(x M_k); map ReLU(sum_k softmax(s)_k A^k) resized
    as the other CAMs. The gradient flows through A twice: the masks and the weighted sum."""
    A = _conv2(p, x, jax.nn.relu)
    (y0, y1, fy), (x0, x1, fx) = _aligned(A.shape[1], H), _aligned(A.shape[2], W)
    rows = A[:, y0] * (1 - fy)[None, :, None, None] + A[:, y1] * fy[None, :, None, None]
    U = rows[:, :, x0] * (1 - fx)[None, None, :, None] + rows[:, :, x1] * fx[None, None, :, None]
    lo, hi = U.min(axis=(1, 2), keepdims=True), U.max(axis=(1, 2), keepdims=True)
    M = jnp.moveaxis((U - lo) / (hi - lo + 1e-8), -1, 1)                                      # (N, K, H, W)
    w = jax.nn.softmax(_chosen(_q_of(p, x[:, None] * M[..., None]), a), -1)
    cam = jax.nn.relu(jnp.einsum("nhwk,nk->nhw", A, w))
    return jax.image.resize(cam, (x.shape[0], H, W), method="bilinear", antialias=False)


GRADCAM = _cam(lambda A, g: g.mean(axis=(1, 2)))
REFERENCES = {  # case (a method, or METHOD_OF it) -> (its options, maps(params, float obs, actions) by hand)
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
    "noise_sensitivity": (NOISE, _noise_sensitivity("chosen_action")),
    "noise_sensitivity_output_l2": ({**NOISE, "score": "output_l2"}, _noise_sensitivity("output_l2")),
    # Paper B's disk, on the incremental path (its 5x5 box is under 1/4 of the frame)
    "sarfa": ({"radius": 2.0, "stride": 2}, _sarfa),
    # masks drawn by the reference (Petsiuk's recipe) and passed as `masks=`: the key's draws are the
    # implementation's (tests/perturbation/test_reference.py checks rise_masks follow the recipe)
    "rise": ({"masks": _rise_masks(), "p_keep": RISE["p_keep"]}, _rise),
    # SLIC by scikit-image on both sides; differentiable through the ridge fit's targets only
    "lime": (LIME, _lime),
    "scorecam": ({"layer": "conv2"}, _scorecam),
}
METHOD_OF = {"noise_sensitivity_output_l2": "noise_sensitivity"}
ATOL = {"noise_sensitivity_output_l2": 1e-5}
"""Cases whose gradient has entries at float32 rounding of the largest (output_l2's q bias cancels in
Q(x) - Q(x'): its true gradient is 0, the reference's ~1e-7): atol as a fraction of the largest."""
# the fast tier keeps one case of each kind (the rest run with the
# slow tests): `make test` stays under 8 minutes
FAST_REF = {"gradient", "g2gradcam", "occlusion"}


def _case(m):
    return pytest.param(m, marks=[] if m in FAST_REF else [pytest.mark.slow])


def _close(got, want, what, atol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(want).max() > 0, f"{what}: all zero, tests nothing"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("case", [_case(m) for m in REFERENCES])
def test_maps_equal_the_method_written_out_by_hand(case):
    (options, ref), method = REFERENCES[case], METHOD_OF.get(case, case)
    got = jaxsal.explain(MODEL.apply, PARAMS, OBS, method=method, **{**OPTIONS.get(method, {}), **options})
    _close(got, ref(PARAMS, OBS.astype(jnp.float32), _actions()), f"{case} maps")


@pytest.mark.parametrize("case", [_case(m) for m in REFERENCES])
def test_param_gradient_equals_the_method_written_out_by_hand(case):
    (options, ref), method = REFERENCES[case], METHOD_OF.get(case, case)
    a, x, w = _actions(), OBS.astype(jnp.float32), _weights((N, H, W))
    want = _flat(jax.grad(lambda p: (ref(p, x, a) * w).sum())(PARAMS))
    _close(_flat(_param_grad(method, **options)), want, f"{case} parameter gradient", ATOL.get(case, 1e-6))


def test_param_gradient_under_jit_equals_eager():
    f = jax.jit(lambda p: _flat_j(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam",
                                                                     layer="conv2").sum())(p)))
    eager = _flat(jax.grad(lambda q: jaxsal.explain(MODEL.apply, q, OBS, method="gradcam", layer="conv2").sum())(PARAMS))
    np.testing.assert_allclose(np.asarray(f(PARAMS)), eager, rtol=1e-5, atol=1e-7 * np.abs(eager).max())


def _flat_j(tree):
    return jnp.concatenate([jnp.ravel(l) for l in jax.tree.leaves(tree)])
