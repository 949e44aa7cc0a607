"""XGrad-CAM (Fu et al. 2020, "Axiom-based Grad-CAM"): one row of the CAM table.

Its channel weight is the gradient averaged with the channel's own activations as weights,
w_k = sum_ij (A^k_ij / sum_ab A^k_ab) g^k_ij, the choice the paper derives from its sensitivity
and conservation axioms (Grad-CAM's plain mean is the special case of a constant A^k). Being a
`register_cam` row, it gets everything the CAM engine gives (jaxsal.backprop.single_backward): layer=,
layer_activation=, per_frame maps on time-distributed trunks, one shared backward in method
lists, jit / vmap / lax.scan.
"""
from __future__ import annotations

import jax.numpy as jnp

from jaxsal.backprop.single_backward import register_cam

EPS = 1e-7
"""Added to the channel sum, as pytorch-grad-cam's XGradCAM.get_cam_weights does."""


def xgradcam_weights(A, g):
    """w_k = sum_ij A_ij g_ij / (sum_ab A_ab + 1e-7): (N,h,w,K), (N,h,w,K) -> (N,K).

    The epsilon is pytorch-grad-cam's, so weights match it wherever its are finite; a channel
    whose denominator is exactly 0 gets w_k = 0 (there pytorch-grad-cam divides by zero). A dead
    channel (A = 0 everywhere, e.g. after a ReLU) gets 0 either way. With A taken before the
    ReLU (the default: the module's output) the sum can be near 0 and the weight large, as in
    pytorch-grad-cam; layer_activation="post_relu" keeps A >= 0.
    """
    denom = A.sum(axis=(1, 2), keepdims=True) + EPS
    safe = jnp.where(denom != 0, denom, 1.0)
    return jnp.where(denom != 0, g * A / safe, 0.0).sum(axis=(1, 2))


xgradcam = register_cam("xgradcam", xgradcam_weights, doc=(
    "XGrad-CAM maps (N, H, W) of the named layer (Fu et al. 2020): Grad-CAM with channel weights "
    "w_k = sum_ij A_ij g_ij / sum_ij A_ij (pytorch-grad-cam's 1e-7 added to the sum); per-frame "
    "maps (N, H, W, T) with per_frame=True on a time-distributed layer, as gradcam."))
