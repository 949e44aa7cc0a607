"""Input-gradient methods vs definitions: gradient, grad x input, SmoothGrad, IG, guided, deconvnet."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from tests._support.gradient_models import ConvHead, init, obs

H, W_, C, A = 5, 6, 2, 3
WL = np.asarray(jax.random.normal(jax.random.PRNGKey(7), (H, W_, C, A)))


def linear(p, x):
    return jnp.einsum("nhwc,hwca->na", x, p)


def cubic(p, x):
    """Q_a = sum p[..., a] * x^3: IG with a black baseline is p[..., a] x^3 exactly."""
    return jnp.einsum("nhwc,hwca->na", x ** 3, p)


X = obs((4, H, W_, C), seed=5)


def test_gradient_and_grad_x_input_linear():
    q = np.asarray(linear(WL, X))
    a = q.argmax(-1)
    g = np.asarray(jaxsal.gradient(linear, WL, X, per_frame=True))
    gx = np.asarray(jaxsal.grad_x_input(linear, WL, X, per_frame=True))
    for n in range(len(X)):
        np.testing.assert_allclose(g[n], WL[..., a[n]], rtol=1e-6)
        np.testing.assert_allclose(gx[n], X[n] * WL[..., a[n]], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(jaxsal.gradient(linear, WL, X), g.sum(-1), rtol=1e-6)


def test_per_sample_actions_batched_equals_per_example():
    acts = np.array([2, 0, 1, 2])
    for method in ("gradient", "guided_backprop", "gradcam", "integrated_gradients"):
        m = ConvHead(kernel=2, stride=2)
        x = obs((4, 8, 8, 2), seed=9)
        p = init(m, x.shape, seed=4)
        kw = {"layer": "conv"} if method == "gradcam" else {}
        batched = np.asarray(jaxsal.explain(m.apply, p, x, method=method, target="q_action", actions=acts,
                                            **kw))
        atol = 1e-5 * np.abs(batched).max()   # of the batch: a state's map may be all 0 (guided)
        for n in range(4):
            one = jaxsal.explain(m.apply, p, x[n:n + 1], method=method, target="q_action",
                                 actions=acts[n:n + 1], **kw)
            np.testing.assert_allclose(batched[n], one[0], rtol=1e-5, atol=atol)


def test_smoothgrad_linear_is_exact():
    key = jax.random.PRNGKey(0)
    a = np.asarray(linear(WL, X)).argmax(-1)
    want = np.stack([WL[..., k] for k in a])
    mean = jaxsal.smoothgrad(linear, WL, X, key=key, n_samples=5, per_frame=True)
    np.testing.assert_allclose(mean, want, rtol=1e-5)
    sg2 = jaxsal.smoothgrad(linear, WL, X, key=key, n_samples=5, per_frame=True, variant="sg2")
    np.testing.assert_allclose(sg2, want ** 2, rtol=1e-5)
    var = jaxsal.smoothgrad(linear, WL, X, key=key, n_samples=5, per_frame=True, variant="vargrad")
    np.testing.assert_allclose(var, 0, atol=1e-5)


def test_smoothgrad_noise_scale_and_determinism():
    """f = 1/2 sum x^2: gradient x + eps, so VarGrad ~ s^2 with s = sigma * range(x)."""
    def quad(p, x):
        return 0.5 * (x ** 2).sum((1, 2, 3))[:, None]
    key = jax.random.PRNGKey(3)
    x = X[:2]
    kw = dict(target=lambda o: o[:, 0], key=key, n_samples=300, per_frame=True, sigma=0.2)
    var = np.asarray(jaxsal.smoothgrad(quad, None, x, variant="vargrad", **kw))
    s = 0.2 * (x.reshape(2, -1).max(1) - x.reshape(2, -1).min(1))
    np.testing.assert_allclose(var.reshape(2, -1).mean(1), s ** 2, rtol=0.05)
    mean = np.asarray(jaxsal.smoothgrad(quad, None, x, **kw))
    assert np.abs(mean - x).mean() < 0.1 * s.mean()
    # same key -> same maps, independent of the chunking; another key -> different maps
    again = jaxsal.smoothgrad(quad, None, x, batch_size=7, **kw)
    np.testing.assert_allclose(again, mean, rtol=1e-5, atol=1e-6)
    other = jaxsal.smoothgrad(quad, None, x, **{**kw, "key": jax.random.PRNGKey(4)})
    assert not np.allclose(other, mean)


S = 16
CUBIC_SUMS = {"riemann_right": (S + 1) * (2 * S + 1) / (2 * S ** 2),
              "riemann_left": (S - 1) * (2 * S - 1) / (2 * S ** 2),
              "riemann_middle": 1 - 1 / (4 * S ** 2),
              "riemann_trapezoid": 1 + 1 / (2 * (S - 1) ** 2),
              "gausslegendre": 1.0}
"""sum_k w_k 3 a_k^2 of each quadrature of S points, in closed form from the rule's definition (right
a_k = k/S, k = 1..S; left k = 0..S-1; middle (k + 1/2)/S; trapezoid S points with halved end weights;
Gauss-Legendre exact), not read from jaxsal's quadrature: a wrong point or weight changes it."""


@pytest.mark.parametrize("rule", sorted(CUBIC_SUMS))
def test_integrated_gradients_cubic_reference(rule):
    """IG of Q_a = sum p x^3 from a black baseline is (x - 0) sum_k w_k 3 p (a_k x)^2 = c p x^3, c the
    rule's sum of 3 a_k^2 (CUBIC_SUMS): checks the path points, the weights and the (x - x0) factor."""
    a = np.asarray(cubic(WL, X)).argmax(-1)
    got = np.asarray(jaxsal.integrated_gradients(cubic, WL, X, steps=S, method=rule,
                                                 per_frame=True))
    want = np.stack([CUBIC_SUMS[rule] * WL[..., a[n]] * X[n] ** 3 for n in range(len(X))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_given_actions_hold_in_every_group_of_the_inner_loop():
    """target="q_action" with actions that are not the greedy ones: IG (cubic: the closed form above) and
    SmoothGrad (linear: W_a exactly) explain the given action in every group of steps or samples
    (batch_size 4 splits 16 steps and 6 samples), never the greedy choice."""
    greedy = np.asarray(cubic(WL, X)).argmax(-1)
    acts = (greedy + 1) % A
    for bs in (None, 4):
        ig = np.asarray(jaxsal.integrated_gradients(cubic, WL, X, steps=S, target="q_action", actions=acts,
                                                    batch_size=bs, per_frame=True))
        want = np.stack([CUBIC_SUMS["riemann_right"] * WL[..., acts[n]] * X[n] ** 3 for n in range(len(X))])
        np.testing.assert_allclose(ig, want, rtol=1e-4, atol=1e-6)
        sg = np.asarray(jaxsal.smoothgrad(linear, WL, X, key=jax.random.PRNGKey(0), n_samples=6, target="q_action",
                                          actions=acts, batch_size=bs, per_frame=True))
        np.testing.assert_allclose(sg, np.stack([WL[..., k] for k in acts]), rtol=1e-5, atol=1e-6)


def test_integrated_gradients_completeness_and_baselines():
    m = ConvHead(kernel=2, stride=2)
    x = obs((3, 8, 8, 2), seed=11, lo=0, hi=1)
    p = init(m, x.shape, seed=5)
    maps, err = jaxsal.integrated_gradients(m.apply, p, x, steps=200, return_error=True)
    q = np.asarray(m.apply(p, x)).max(-1)
    assert maps.shape == (3, 8, 8)
    assert np.abs(np.asarray(err)).max() < 0.02 * np.abs(q).max() + 1e-4
    base = np.full((8, 8, 2), 0.5, np.float32)
    m2, err2 = jaxsal.integrated_gradients(m.apply, p, x, steps=200, baseline=base,
                                           return_error=True, method="gausslegendre")
    assert np.abs(np.asarray(err2)).max() < 0.02 * np.abs(q).max() + 1e-4
    blur = jaxsal.integrated_gradients(m.apply, p, x, steps=8, baseline="blur", blur_sigma=1.0)
    assert blur.shape == (3, 8, 8) and bool(jnp.isfinite(blur).all())
    u1 = jaxsal.integrated_gradients(m.apply, p, x, steps=8, baseline="uniform",
                                     key=jax.random.PRNGKey(1))
    u2 = jaxsal.integrated_gradients(m.apply, p, x, steps=8, baseline="uniform",
                                     key=jax.random.PRNGKey(1), batch_size=5)
    np.testing.assert_allclose(u1, u2, rtol=1e-5, atol=1e-7)
    with pytest.raises(SaliencyInputError, match="key"):
        jaxsal.integrated_gradients(m.apply, p, x, baseline="uniform")
    with pytest.raises(SaliencyInputError, match="broadcast"):
        jaxsal.integrated_gradients(m.apply, p, x, baseline=np.zeros((3, 3)))


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_integrated_gradients_blur_baseline_blurs_each_frame_alone(sigma):
    """On a linear model IG is (x - x0) W_a for any path; with baseline="blur" x0 is each stacked frame
    blurred on its own (scipy's gaussian_filter, edge mode, 3 sigma), never mixed across frames."""
    import scipy.ndimage

    a = np.asarray(linear(WL, X)).argmax(-1)
    got = np.asarray(jaxsal.integrated_gradients(linear, WL, X, steps=2, baseline="blur", blur_sigma=sigma,
                                                 per_frame=True))
    x0 = scipy.ndimage.gaussian_filter(np.asarray(X, np.float64), (0, sigma, sigma, 0), mode="nearest",
                                       truncate=3.0)
    want = np.stack([(X[n] - x0[n]) * WL[..., a[n]] for n in range(len(X))])
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_integrated_gradients_blur_baseline_of_channel_first_frames():
    """baseline="blur" on NCHW frames blurs each frame over its own H and W axes, as on NHWC frames (scipy's
    gaussian_filter, edge mode, 3 sigma): never along the channel axis. Linear model: IG is (x - x0) W_a."""
    import scipy.ndimage

    def linear_nchw(p, x):
        return jnp.einsum("nchw,hwca->na", x, p)

    a = np.asarray(linear(WL, X)).argmax(-1)
    got = np.asarray(jaxsal.integrated_gradients(linear_nchw, WL, np.transpose(X, (0, 3, 1, 2)), layout="NCHW",
                                                 steps=2, baseline="blur", blur_sigma=1.0, per_frame=True))
    x0 = scipy.ndimage.gaussian_filter(np.asarray(X, np.float64), (0, 1.0, 1.0, 0), mode="nearest", truncate=3.0)
    want = np.stack([(X[n] - x0[n]) * WL[..., a[n]] for n in range(len(X))])  # per_frame maps are NHWC
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_integrated_gradients_uniform_baseline_spans_each_states_own_range():
    """baseline="uniform": x0 = min x + U (max x - min x) per state, U ~ U(0, 1) drawn from
    fold_in(key, first_index + i) (the combinators' documented draw). Linear model: IG is (x - x0) W_a, so
    the maps give x0 back; frames in [60, 200] tell min + U (max - min) from U max."""
    key = jax.random.PRNGKey(11)
    x = np.random.default_rng(3).uniform(60.0, 200.0, (3, H, W_, C)).astype(np.float32)
    a = np.asarray(linear(WL, x)).argmax(-1)
    got = np.asarray(jaxsal.integrated_gradients(linear, WL, x, steps=2, baseline="uniform", key=key,
                                                 first_index=5, per_frame=True))
    for n in range(len(x)):
        u = np.asarray(jax.random.uniform(jax.random.fold_in(key, 5 + n), x.shape[1:]), np.float64)
        x0 = x[n].min() + u * (x[n].max() - x[n].min())
        np.testing.assert_allclose(got[n], (x[n] - x0) * WL[..., a[n]], rtol=1e-4,
                                   atol=1e-5 * np.abs(x[n] * WL[..., a[n]]).max())


def test_ig_step_chunking_matches_unchunked():
    a = jaxsal.integrated_gradients(cubic, WL, X, steps=20)
    b = jaxsal.integrated_gradients(cubic, WL, X, steps=20, batch_size=7)   # 7-step groups
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_guided_and_deconvnet_on_conv_relu_net():
    """Guided backprop differs from the plain gradient; all are finite and signed."""
    m = ConvHead(kernel=2, stride=2, hidden=8)
    x = obs((3, 8, 8, 2), seed=2)
    p = init(m, x.shape, seed=8)
    r = jaxsal.explain(m.apply, p, x, method=["gradient", "guided_backprop", "deconvnet"],
                       per_frame=True)
    assert not np.allclose(r["gradient"], r["guided_backprop"])
    assert not np.allclose(r["deconvnet"], r["guided_backprop"])
    for v in r.values():
        assert v.shape == (3, 8, 8, 2)
    assert (np.asarray(r["guided_backprop"]) < 0).any()  # signed: the first conv has signs


def test_uint8_obs_and_per_state_baseline():
    m = ConvHead(kernel=2, stride=2)
    x8 = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 2), dtype=np.uint8)
    p = init(m, x8.shape, seed=5, scale=0.05)
    for method in ("gradient", "gradcam"):
        # uint8 frames are cast inside the program: another program, so a pixel near 0 is compared to
        # 1e-6 of the map's largest value
        want = np.asarray(jaxsal.explain(m.apply, p, x8.astype(np.float32), method=method))
        np.testing.assert_allclose(jaxsal.explain(m.apply, p, x8, method=method), want, rtol=1e-6,
                                   atol=1e-6 * np.abs(want).max())
    const = np.full((8, 8, 2), 20.0, np.float32)
    a = jaxsal.integrated_gradients(m.apply, p, x8, steps=4, baseline=const)
    b = jaxsal.integrated_gradients(m.apply, p, x8, steps=4,
                                    baseline=np.broadcast_to(const, x8.shape))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
