"""The CAM family is a table: a new variant is its channel-weight function and one
`jaxsal.register_cam`; the shipped variants are rows of the same table."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.backprop import cam
from jaxsal.backprop.layers import tap
from jaxsal.errors import SaliencyInputError
from jaxsal.registry import METHODS, SPECS, register
from tests._support.conformance import MODEL, PARAMS, _obs


def test_shipped_variants_are_table_rows():
    assert jaxsal.cam_methods() == sorted(["gradcam", "gradcam_pp", "g1gradcam", "g2gradcam",
                                           "guided_gradcam", "xgradcam"])
    assert cam.CAMS["g2gradcam"] == cam.CamSpec(cam.gradcam_weights, "guided", True, True)
    assert cam.CAMS["gradcam_pp"].weights is cam.gradcam_pp_weights


def test_a_new_variant_is_one_registration():
    def xgradcam_weights(A, g):
        """XGrad-CAM (Fu 2020): w_k = sum_ij A_ij g_ij / sum_ij A_ij."""
        return (A * g).sum((1, 2)) / (A.sum((1, 2)) + 1e-7)

    try:
        jaxsal.register_cam("xgradcam_test", xgradcam_weights)
        assert "xgradcam_test" in jaxsal.methods() and "xgradcam_test" in jaxsal.cam_methods()
        obs = _obs()
        got = jaxsal.explain(MODEL.apply, PARAMS, obs, method="xgradcam_test", layer="conv2")
        # by hand: the layer's output A, dQ_a/dA at the greedy action, the weights, ReLU, resize
        x = jnp.asarray(obs, jnp.float32)
        f = tap(MODEL.apply, "conv2")
        y, A = f(PARAMS, x, 0.0)
        a = jnp.argmax(y, -1)
        g = jax.grad(lambda e: jnp.take_along_axis(f(PARAMS, x, e)[0], a[:, None], 1).sum())(
            jnp.zeros_like(A))
        w = xgradcam_weights(A, g)
        ref = jax.image.resize(jax.nn.relu(jnp.einsum("nhwk,nk->nhw", A, w)),
                               got.shape, "bilinear", antialias=False)
        assert float(jnp.abs(ref).max()) > 0
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
        # and it shares the one forward/backward with the shipped variants in a method list
        both = jaxsal.explain(MODEL.apply, PARAMS, obs, method=["gradcam", "xgradcam_test"],
                              layer="conv2")
        np.testing.assert_allclose(both["xgradcam_test"], got, rtol=1e-5, atol=1e-7)
    finally:
        jaxsal.unregister("xgradcam_test")  # its method, its table row and its spec
    assert "xgradcam_test" not in METHODS and "xgradcam_test" not in SPECS and "xgradcam_test" not in cam.CAMS


def test_register_cam_rejects_an_unknown_rule():
    with pytest.raises(ValueError, match="rule must be"):
        jaxsal.register_cam("bad_cam_test", cam.gradcam_weights, rule="deconvnet")
    assert "bad_cam_test" not in METHODS


def test_a_taken_name_is_refused_unless_replaced():
    with pytest.raises(SaliencyInputError, match="'xgradcam' is already registered.*replace=True"):
        jaxsal.register_cam("xgradcam", cam.gradcam_weights)
    assert cam.CAMS["xgradcam"].weights is not cam.gradcam_weights        # the built-in is untouched
    with pytest.raises(SaliencyInputError, match="'occlusion' is already registered"):
        register("occlusion")(lambda apply_fn, params, obs: None)
    try:  # the same definition again (a re-run cell) and an explicit replace are allowed
        jaxsal.register_cam("cam_again_test", cam.gradcam_weights)
        jaxsal.register_cam("cam_again_test", cam.gradcam_weights)
        with pytest.raises(SaliencyInputError, match="already registered"):   # another weight function
            jaxsal.register_cam("cam_again_test", cam.gradcam_pp_weights)
        jaxsal.register_cam("cam_again_test", cam.gradcam_pp_weights, replace=True)
        assert cam.CAMS["cam_again_test"].weights is cam.gradcam_pp_weights
    finally:
        while "cam_again_test" in jaxsal.METHODS:  # the replaced definition comes back: remove it too
            jaxsal.unregister("cam_again_test")  # its method, its table row and its spec
