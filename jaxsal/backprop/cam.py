"""CAM family math and its table of variants: Grad-CAM, Grad-CAM++, G1/G2 Grad-CAM (Paper A),
Guided Grad-CAM. A variant is a `CamSpec` (channel-weight function + which gradient, whether
maps are max-normalised, whether they multiply guided backprop); `jaxsal.register_cam` adds
one and registers it with `jaxsal.explain` (the specs are in jaxsal.backprop.single_backward).

All share one base: the named layer's activations A (N, h, w, K) and the gradient g of the
per-sample target w.r.t. A (plain, or through guided ReLUs for G1/G2); only the channel
weights w_k differ. Maps are ReLU(sum_k w_k A^k), upsampled bilinearly to the input size.
The gradient is averaged over (h, w), never over (w, K) (Paper A's code defect).

A is the named module's output, as Captum and pytorch-grad-cam take it (pre-activation when
the ReLU is applied outside the module, as in NatureDQN's conv3). `layer_activation="relu"`
uses A' = ReLU(A) instead; its gradient is then dY/dA' where A > 0 and 0 elsewhere (the
following ReLU masks it), which can differ from a peer tapping a separate ReLU module.
Layer outputs must be channels-last (N, h, w, K), as flax convolutions give.

Time-distributed trunks (Paper A's split-attention agent: one CNN shared by the T frames of a
state, so the layer outputs (N*T, h, w, K), row n*T + t = frame t of state n): the CAM is
computed per (state, frame) from that frame's A and dY/dA, as the definition says per map.
`per_frame=True` gives (N, H, W, T), the frame axis last as per_frame input-gradient maps
(N, H, W, C) have it (jaxsal.metrics.frame_shares takes both); the default is the frame
sum (N, H, W), so every consumer of (N, H, W) maps works unchanged. G1/G2 divide by the max
over all T frames of a state, so frames stay comparable (a frame the agent ignores is not
blown up to full scale); G1's default is the normalised frame sum. G2/Guided Grad-CAM multiply
frame t's CAM with guided backprop on that frame's input channels (frame-major stack).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxsal import registry


class CamSpec(NamedTuple):
    """One CAM variant: w = weights(A, g) (N,h,w,K),(N,h,w,K) -> (N,K), g = dY/dA through
    `rule` ReLUs ("plain" or "guided"); `normalise`: each map / its max (per state, over its
    frames); `guided_input`: max(CAM, 0) * max(guided backprop, 0) at input resolution;
    `uses_gradients` False: g is not dY/dA but per-channel scores (N, K) of forward passes
    (Score-CAM; pytorch-grad-cam's uses_gradients=False)."""
    weights: Callable
    rule: str = "plain"
    normalise: bool = False
    guided_input: bool = False
    uses_gradients: bool = True


CAMS: dict[str, CamSpec] = {}
"""name -> CamSpec of every registered CAM variant (filled by jaxsal.register_cam)."""
registry.TABLES.append(CAMS)  # jaxsal.unregister clears a variant's row with its method


def gradcam_weights(A, g):
    """Grad-CAM (Selvaraju 2017): w_k = mean_ij g^k_ij. Shapes (N,h,w,K) -> (N,K)."""
    del A
    return g.mean(axis=(1, 2))


def gradcam_pp_weights(A, g):
    """Grad-CAM++ (Chattopadhyay 2018, exponential trick, as pytorch-grad-cam).

    alpha_ij = g^2 / (2 g^2 + sum_ab A_ab g^3) (0 where g = 0); w_k = sum_ij alpha_ij ReLU(g_ij).
    """
    g2 = g * g
    g3 = g2 * g
    denom = 2.0 * g2 + A.sum(axis=(1, 2), keepdims=True) * g3
    safe = jnp.where(denom != 0, denom, 1.0)
    alpha = jnp.where((g != 0) & (denom != 0), g2 / safe, 0.0)
    return (alpha * jax.nn.relu(g)).sum(axis=(1, 2))


def scorecam_weights(A, s):
    """Score-CAM (Wang 2020): w = softmax_k(s_k), s (N, K) the target's scores of the input
    masked by each channel's map (forward passes, no gradient)."""
    del A
    return jax.nn.softmax(s, axis=-1)


def cam_map(A, w):
    """ReLU(sum_k w_k A^k): (N,h,w,K), (N,K) -> (N,h,w)."""
    return jax.nn.relu(jnp.einsum("nhwk,nk->nhw", A, w))


def upsample(cam, hw):
    """Bilinear resize (N, h, w) -> (N, H, W), half-pixel centres (as cv2.resize)."""
    if tuple(cam.shape[1:]) == tuple(hw):
        return cam
    return jax.image.resize(cam, (cam.shape[0], *hw), method="bilinear", antialias=False)


def to_frames(cam, k):
    """State-major rows (N*k, H, W) -> per-frame maps (N, H, W, k)."""
    return jnp.moveaxis(cam.reshape((-1, k) + cam.shape[1:]), 1, -1)


def normalise_max(m):
    """Divide each map by its max (0 maps stay 0)."""
    mx = m.reshape(m.shape[0], -1).max(axis=1).reshape((-1,) + (1,) * (m.ndim - 1))
    return jnp.where(mx > 0, m / jnp.where(mx > 0, mx, 1.0), 0.0)


def cam_maps(spec: CamSpec, A, g, guided_x, hw, k: int, per_frame: bool):
    """The maps of one variant from the tapped activations A, their gradient g (spec.rule) and,
    for guided_input variants, the guided input gradient (N, H, W, C) in NHWC.

    k = 1: (N, H, W) ((N, H, W, C) with per_frame for guided_input variants). k > 1 (a trunk
    run on k frames per state): per-frame maps (N, H, W, k) with per_frame, else the frame sum.
    """
    chex.assert_rank(A, 4)  # trace-time: channels-last layer output (N*k, h, w, K)
    if spec.uses_gradients:
        chex.assert_equal_shape([A, g])
    c = upsample(cam_map(A, spec.weights(A, g)), hw)
    if k > 1:
        c = to_frames(c, k)
    if not spec.guided_input:
        if k > 1 and not per_frame:
            c = c.sum(-1)
        return normalise_max(c) if spec.normalise else c
    if spec.normalise:
        c = normalise_max(c)
    gb = jax.nn.relu(guided_x)
    c = jax.nn.relu(c)
    c = jnp.repeat(c, gb.shape[-1] // k, axis=-1) if k > 1 else c[..., None]
    prod = c * gb
    return prod if per_frame else prod.sum(-1)
