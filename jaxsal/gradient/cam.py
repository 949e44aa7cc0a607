"""CAM family: Grad-CAM, Grad-CAM++, G1/G2 Grad-CAM (Paper A), Guided Grad-CAM.

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
(N, H, W, C) have it (jaxsal.frame_stats.frame_shares takes both); the default is the frame
sum (N, H, W), so every consumer of (N, H, W) maps works unchanged. G1/G2 divide by the max
over all T frames of a state, so frames stay comparable (a frame the agent ignores is not
blown up to full scale); G1's default is the normalised frame sum. G2/Guided Grad-CAM multiply
frame t's CAM with guided backprop on that frame's input channels (frame-major stack).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal.registry import register


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


def _family(name, apply_fn, params, obs, **kw):
    from jaxsal.gradient.family import compute
    return compute((name,), apply_fn, params, obs, **kw)[name]


@register("gradcam")
def gradcam(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
            batch_size=None, layer=None, per_frame=False, layer_activation=None,
                   fast_conv=True):
    """Grad-CAM maps (N, H, W) of the named layer (default: last conv-like layer); per-frame
    maps (N, H, W, T) with per_frame=True on a time-distributed layer (module docstring)."""
    return _family("gradcam", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                   layer_activation=layer_activation, fast_conv=fast_conv)


@register("gradcam_pp")
def gradcam_pp(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
               batch_size=None, layer=None, per_frame=False, layer_activation=None,
                   fast_conv=True):
    """Grad-CAM++ maps (N, H, W) of the named layer ((N, H, W, T) per frame, as gradcam)."""
    return _family("gradcam_pp", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                   layer_activation=layer_activation, fast_conv=fast_conv)


@register("g1gradcam")
def g1gradcam(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
              batch_size=None, layer=None, per_frame=False, layer_activation=None,
                   fast_conv=True):
    """G1Grad-CAM (Paper A): Grad-CAM with guided-ReLU gradients, each map divided by its max
    ((N, H, W, T) per frame, as gradcam, divided by the max over the state's frames)."""
    return _family("g1gradcam", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                   layer_activation=layer_activation, fast_conv=fast_conv)


@register("g2gradcam")
def g2gradcam(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
              batch_size=None, layer=None, per_frame=False, layer_activation=None,
                   fast_conv=True):
    """G2Grad-CAM (Paper A): max(G1, 0) * max(guided backprop, 0), per frame then summed."""
    return _family("g2gradcam", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                   layer_activation=layer_activation, fast_conv=fast_conv)


@register("guided_gradcam")
def guided_gradcam(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC",
                   key=None, batch_size=None, layer=None, per_frame=False,
                   layer_activation=None, fast_conv=True):
    """Guided Grad-CAM: max(Grad-CAM, 0) * max(guided backprop, 0), per frame then summed."""
    return _family("guided_gradcam", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, layer=layer, per_frame=per_frame,
                   layer_activation=layer_activation, fast_conv=fast_conv)
