"""CAM family against hand-derived numpy references (known-answer models)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from _gradient_models import ConvHead, LinearConv, bilinear_ref, init, obs


def conv_out(model, params, x):
    c = nn.Conv(model.features, (model.kernel,) * 2, (model.stride,) * 2, padding="VALID")
    return np.asarray(c.apply({"params": params["params"]["conv"]}, jnp.asarray(x)), np.float64)


def test_gradcam_known_answer_linear_head():
    """y_a = sum W[ijk, a] A_ijk + b, so g = W[:, a] and w_k = mean_ij W[ijk, a]."""
    m = LinearConv()
    x = obs((3, 8, 8, 2))
    p = init(m, x.shape)
    A = conv_out(m, p, x)                                     # (3, 4, 4, 3)
    W = np.asarray(p["params"]["q"]["kernel"]).reshape(4, 4, 3, -1)
    q = np.asarray(m.apply(p, x))
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv"))
    assert got.shape == (3, 8, 8)
    for n in range(3):
        a = q[n].argmax()
        w = W[..., a].mean(axis=(0, 1))                        # mean over (h, w), not (w, K)
        cam = np.maximum((A[n] * w).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def manual_grads(m, p, x, a, rule):
    """dy_a/dA at the conv output (pre-activation) through ConvHead's ReLUs, by hand."""
    A = conv_out(m, p, x)
    W1 = np.asarray(p["params"]["fc1"]["kernel"], np.float64)
    b1 = np.asarray(p["params"]["fc1"]["bias"], np.float64)
    W2 = np.asarray(p["params"]["q"]["kernel"], np.float64)
    gs = []
    for n in range(x.shape[0]):
        h = np.maximum(A[n].ravel(), 0)
        z1 = h @ W1 + b1
        r = W2[:, a[n]]
        r = (z1 > 0) * ((r > 0) if rule == "guided" else 1) * r
        rh = W1 @ r
        rh = (A[n].ravel() > 0) * ((rh > 0) if rule == "guided" else 1) * rh
        gs.append(rh.reshape(A[n].shape))
    return A, np.stack(gs)


@pytest.fixture(scope="module")
def head():
    m = ConvHead(kernel=2, stride=2, hidden=6)
    x = obs((4, 8, 8, 2), seed=3)
    p = init(m, x.shape, seed=2)
    a = np.asarray(m.apply(p, x)).argmax(-1)
    return m, p, x, a


def test_gradcam_nonlinear_head(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv"))
    for n in range(len(x)):
        cam = np.maximum((A[n] * g[n].mean(axis=(0, 1))).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def test_gradcam_pp_reference(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam_pp(m.apply, p, x, layer="conv"))
    for n in range(len(x)):
        g2, g3 = g[n] ** 2, g[n] ** 3
        denom = 2 * g2 + A[n].sum(axis=(0, 1)) * g3
        alpha = np.where(g[n] != 0, g2 / np.where(denom != 0, denom, 1), 0)
        w = (alpha * np.maximum(g[n], 0)).sum(axis=(0, 1))
        cam = np.maximum((A[n] * w).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def guided_input(m, p, x, a):
    """Guided backprop to the input: guided layer gradient, then the (linear) conv transposed."""
    _, gg = manual_grads(m, p, x, a, "guided")
    conv = nn.Conv(m.features, (m.kernel,) * 2, (m.stride,) * 2, padding="VALID")
    cp = {"params": p["params"]["conv"]}
    _, vjp = jax.vjp(lambda xx: conv.apply(cp, xx), jnp.asarray(x))
    return np.asarray(vjp(jnp.asarray(gg, jnp.float32))[0], np.float64)


def test_g1_g2_guided_gradcam_reference(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    _, gg = manual_grads(m, p, x, a, "guided")
    gb = guided_input(m, p, x, a)
    got = jaxsal.explain(m.apply, p, x, method=["g1gradcam", "g2gradcam", "guided_gradcam",
                                                 "guided_backprop"], layer="conv")
    np.testing.assert_allclose(got["guided_backprop"], gb.sum(-1), rtol=1e-4, atol=1e-6)
    for n in range(len(x)):
        g1 = bilinear_ref(np.maximum((A[n] * gg[n].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
        g1 = g1 / g1.max() if g1.max() > 0 else g1
        np.testing.assert_allclose(got["g1gradcam"][n], g1, rtol=1e-4, atol=1e-6)
        gc = bilinear_ref(np.maximum((A[n] * g[n].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
        np.testing.assert_allclose(got["guided_gradcam"][n],
                                   (gc[..., None] * np.maximum(gb[n], 0)).sum(-1),
                                   rtol=1e-4, atol=1e-8)
        np.testing.assert_allclose(got["g2gradcam"][n],
                                   (g1[..., None] * np.maximum(gb[n], 0)).sum(-1),
                                   rtol=1e-4, atol=1e-8)
    per = jaxsal.guided_gradcam(m.apply, p, x, layer="conv", per_frame=True)
    assert per.shape == (4, 8, 8, 2)
    np.testing.assert_allclose(per.sum(-1), got["guided_gradcam"], rtol=1e-5, atol=1e-9)


def test_layer_activation_relu(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv", layer_activation="relu"))
    for n in range(len(x)):
        # A is post-ReLU; g is dY/dA' where A > 0 and 0 elsewhere (g already carries 1[A > 0]).
        cam = np.maximum((np.maximum(A[n], 0) * g[n].mean(axis=(0, 1))).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def test_nature_dqn_default_and_early_layers():
    from agents.networks import NatureDQN
    m = NatureDQN(4)
    x = obs((2, 84, 84, 4), lo=0, hi=255)
    p = m.init(jax.random.PRNGKey(0), x)
    default = jaxsal.explain(m.apply, p, x, method="gradcam")
    np.testing.assert_allclose(default, jaxsal.gradcam(m.apply, p, x, layer="conv3"))
    for layer in ("conv1", "conv2"):
        cam = jaxsal.gradcam(m.apply, p, x, layer=layer)
        assert cam.shape == (2, 84, 84) and bool(jnp.isfinite(cam).all())
        assert float(cam.max()) > 0


def test_per_frame_rejected_for_layer_resolution_maps(head):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match="per_frame"):
        jaxsal.explain(m.apply, p, x, method="gradcam", per_frame=True)


def test_cam_rejects_dense_layer_and_unknown_activation(head):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match="spatial"):
        jaxsal.gradcam(m.apply, p, x, layer="fc1")
    with pytest.raises(SaliencyInputError, match="layer_activation"):
        jaxsal.gradcam(m.apply, p, x, layer="conv", layer_activation="swishy")
