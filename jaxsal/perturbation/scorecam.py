"""Score-CAM (Wang et al. 2020): a CAM whose channel weights come from forward passes, not gradients.

For each channel k of the tapped layer (A: (N, h, w, K), the named flax module's output, as the
gradient CAMs take it), A^k is upsampled to the input size, min-max normalised to [0, 1] per
(state, channel) and multiplies the input (every stacked frame): x_k = x * M_k. The explained
target's score on x_k, s_k = t(x_k) with the action fixed once from the clean forward pass, gives
the weights w = softmax_k(s); the map is ReLU(sum_k w_k A^k), upsampled like the other CAMs.

As pytorch-grad-cam's ScoreCAM (what users compare with): the upsampling is bilinear with
align_corners=True (its torch.nn.UpsamplingBilinear2d; the final map, like every jaxsal CAM,
uses half-pixel centres), the normalisation is (U - min) / (max - min + 1e-8), and s_k is the
raw target (Q of the action by default, its ClassifierOutputTarget's logit). The paper instead
scores the increase of confidence f(x_k) - f(x_b) over a baseline input x_b, with f a softmax
class probability; a per-state baseline cancels in the softmax over channels, so only f differs:
target="softmax_chosen" scores the action's probability.

On the one engine it is a CAM whose weights come from forward passes (the table row SCORECAM,
`uses_gradients=False`) run as a perturbation spec (jaxsal.perturbation._common): per chunk of
states the activations are computed and each masked input is built on device, in groups of
states x channels of at most batch_size model rows, so memory is bounded by batch_size for any N
and K, with no Python loop over states or channels. The layer is found and tapped by flax
module name exactly as the CAM family does (jaxsal.backprop.layers).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.batching import head
from jaxsal.caching import memo
from jaxsal.checks import as_float
from jaxsal.errors import SaliencyInputError
from jaxsal.backprop import cam
from jaxsal.backprop.cam_site import CAM_ACTIVATIONS, cam_site
from jaxsal.backprop.layers import get_activation, resolve_tap, tap
from jaxsal.perturbation import _common as C

NORM_EPS = 1e-8
"""Added to (max - min) of each upsampled activation map, as pytorch-grad-cam's ScoreCAM does."""


@memo("Score-CAM resize matrices", 64)
def align_corners_matrix(n: int, size: int) -> np.ndarray:
    """(size, n) matrix of 1-D linear interpolation from n to `size` samples with aligned corners
    (torch's align_corners=True: output i samples input i (n - 1) / (size - 1)); bilinear
    resizing is separable, so an (h, w) map resizes as U_h A U_w^T."""
    src = np.arange(size) * ((n - 1) / (size - 1)) if size > 1 else np.zeros(1)
    i0 = np.minimum(np.floor(src).astype(int), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    frac = src - i0
    u = np.zeros((size, n))
    np.add.at(u, (np.arange(size), i0), 1.0 - frac)
    np.add.at(u, (np.arange(size), i1), frac)
    return u.astype(np.float32)


def channel_masks(A, uy, ux):
    """Score-CAM's masks (..., H, W, K) of activations A (..., h, w, K): each channel upsampled
    (U_h A^k U_w^T, align_corners) and min-max normalised to [0, 1] over its (H, W)."""
    hi = jax.lax.Precision.HIGHEST
    u = jnp.einsum("Hh,...hwk,Ww->...HWk", uy, A, ux, precision=hi)
    lo, top = u.min(axis=(-3, -2), keepdims=True), u.max(axis=(-3, -2), keepdims=True)
    return (u - lo) / (top - lo + NORM_EPS)


SCORECAM = cam.CamSpec(cam.scorecam_weights, rule="forward", uses_gradients=False)
"""Score-CAM's row of the CAM math: weights softmax(s) of forward-pass scores."""


# the method's signature and docstring; the function registered below runs SPEC on the engine
def scorecam(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
             batch_size=None, precision="float32", layer=None, per_frame=False, layer_activation=None):
    """Score-CAM maps (Wang et al. 2020) of a layer: a CAM whose channel weights are the softmax
    of the target on the input masked by each channel's normalised, upsampled activation map.

    K forward passes per state (K = the layer's channels, 64 for the Nature CNN's conv3), as
    pytorch-grad-cam's ScoreCAM computes them (the module docstring compares it with the paper).

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output` (Q-values (N, A), or a
            dict/tuple with them or policy logits).
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) in layout "NCHW".
        target (str | Callable): what is explained (`jaxsal.targets`: a name or a callable
            `output -> (N,)`).
        actions (jax.Array | None): (N,) actions to explain (needed by "q_action"); None: the
            target's choice on the clean input, fixed once.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        batch_size (int | None): model rows (states x channels) per forward pass; None: the
            backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        layer (str | None): the flax module whose output is A (N, h, w, K); None: the last
            conv-like layer. It must run once per state (not a trunk shared by the frames).
        per_frame (bool): not supported (every mask covers the whole stacked input); True is
            refused.
        layer_activation (str | Callable | None): where A is read, as for `gradcam`: None or
            "module" (the module's output), "post_relu" (after the normalisation and ReLU that
            follow it), an activation name such as "relu", or a callable applied to the output.

    Returns:
        jax.Array: the maps, shape (N, H, W) float32, ReLU(sum_k w_k A^k) upsampled as every
            jaxsal CAM.

    Raises:
        jaxsal.SaliencyInputError: `per_frame=True`; an unknown `layer` or `layer_activation`; a
            layer that runs more than once per state; or a bad call (obs, target, actions, layout,
            batch_size), as `jaxsal.explain` reports it.
    """


def _prepare(call, apply_fn, params, *, layer, per_frame, layer_activation):
    if per_frame:
        raise SaliencyInputError(
            "scorecam gives one layer-resolution map per state: per_frame=True is for input-"
            "resolution methods, or for gradcam/xgradcam on a time-distributed layer (per-frame "
            "CAMs); drop per_frame for scorecam")
    x1 = as_float(head(call.x))
    if isinstance(layer_activation, str) and layer_activation in CAM_ACTIVATIONS:
        layer, layer_activation = cam_site(apply_fn, params, x1, layer, layer_activation)
    get_activation(layer_activation)
    name, k = resolve_tap(apply_fn, params, x1, layer, layer_activation)
    if k > 1:
        raise SaliencyInputError(
            f"layer {name!r} runs {k} times per state (a trunk shared by the frames): Score-CAM "
            "masks the whole stacked input with one map per channel, so it needs a layer that runs "
            "once per state; tap one (layer=...), or use gradcam/xgradcam, which give per-frame CAMs "
            "there (per_frame=True)")
    tapped = tap(apply_fn, name, layer_activation)
    a_shape = jax.eval_shape(lambda p, xx: tapped(p, xx, 0.0)[1], params, x1).shape
    (h, w, n_ch), hw = a_shape[1:], call.hwc[:2]
    layout = call.layout

    def states(params, consts, x, extra):
        """The chunk's activations A (S, h, w, K) (x: NHWC; the model taps its own layout)."""
        return {"A": tapped(params, x if layout == "NHWC" else jnp.transpose(x, (0, 3, 1, 2)), 0.0)[1]}

    def perturb(consts, st, idx):
        """One state's input x (H, W, C) times the normalised, upsampled map of channel idx."""
        a = jnp.take(st["A"], idx[None], axis=-1)                       # (h, w, 1)
        return st["x"] * channel_masks(a, consts["uy"], consts["ux"])  # (H, W, 1) over all C

    def finish(consts, x, extra, scores):
        return cam.cam_maps(SCORECAM, extra["A"], scores, None, hw, 1, False)

    consts = {"uy": jnp.asarray(align_corners_matrix(h, hw[0])), "ux": jnp.asarray(align_corners_matrix(w, hw[1]))}
    return C.prepared(call, perturb=perturb, score=C.make_score("target", call.target), finish=finish,
                      n_pert=n_ch, consts=consts, states=states, model=(apply_fn, params))


SPEC = C.perturbation_spec("scorecam", _prepare, C.options_of(scorecam), example={"layer": "conv2"})
scorecam = C.register(SPEC, scorecam)
