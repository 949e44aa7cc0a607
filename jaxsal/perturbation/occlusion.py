"""Occlusion sensitivity (Zeiler & Fergus 2014, as benchmarked in Paper B): slide a filled patch."""
from __future__ import annotations

import math

import jax.numpy as jnp

from jaxsal.perturbation import _common as C

OCCLUSION_SCORES = ("one_minus", "drop", "softmax_drop", "chosen_action", "output_l2", "target")


def occlusion_grid_shape(hw, patch: int, stride: int):
    """Number of patch positions per axis: starts 0, stride, ... until the patch reaches the edge
    (a last start past H - patch gives a patch clipped by the border)."""
    return tuple(int(math.ceil((L - patch) / stride)) + 1 for L in hw)


def _patch_mask(gy, gx, hw, patch, stride):
    ii = jnp.arange(hw[0])[:, None]
    jj = jnp.arange(hw[1])[None, :]
    si, sj = gy * stride, gx * stride
    return ((ii >= si) & (ii < si + patch) & (jj >= sj) & (jj < sj + patch)).astype(jnp.float32)


# the method's signature and docstring; the function registered below runs SPEC on the engine
def occlusion(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
              batch_size=None, precision="float32", patch: int = 2, stride: int = 2, fill=0.0, score: str = "one_minus",
              upsample: str = "bilinear", obs_max=None, incremental: bool | None = None,
              return_grid: bool = False):
    """Occlusion maps (Zeiler & Fergus 2014): how the target changes when a square patch of every
    stacked frame is filled, on a grid of patch positions resized to the input.

    Defaults are Paper B's: a black 2x2 patch every 2 px (a 42x42 grid on 84x84 frames), scored
    1 - Q_a(x'). Cost: one forward pass per patch position and state.

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
        batch_size (int | None): model rows (states x patch positions) per forward pass; None:
            the backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        patch (int): the patch's side in pixels.
        stride (int): pixels between patch positions; a last position past H - patch gives a
            patch clipped by the border.
        fill (float | str): what the patch is set to: a fraction of the value range (0 black,
            0.5 grey = 127.5 for 0..255 frames; see `obs_max`), or "black", "grey", "white" or
            "mean" (each state's mean per stacked frame).
        score (str): "one_minus" (default) 1 - t(x'); "drop" t(x) - t(x'); "softmax_drop" the
            drop of softmax(Q)_a; "chosen_action" 1 - softmax(Q(x'))_a; "output_l2"
            1/2 ||f(x) - f(x')||^2 over the whole output; "target" t(x').
        upsample (str): how the score grid is resized to (H, W): "bilinear" (default) or
            "nearest" (half-pixel centres, as PIL and scikit-image).
        obs_max (float | None): the top of the observations' value range, which `fill`
            fractions scale; None: 255 for integer frames, for float frames 1.0 when every
            value is <= 1, else 255.
        incremental (bool | None): recompute only the perturbed box's receptive field in each
            flax `nn.Conv` and run the rest of the model as is (equal to the plain path up to
            float rounding: the code between convs proven local when traced, else checked at
            run time, falling back to the plain path for non-local ops). None (default): on when the box covers <= 1/4 of the image; True/False force it.
        return_grid (bool): return the (N, gy, gx) score grid instead of the resized map.

    Returns:
        jax.Array: the maps, shape (N, H, W) float32; with `return_grid=True` the grid
            (N, gy, gx).

    Raises:
        jaxsal.SaliencyInputError: `patch` or `stride` not a positive int that fits the image; an
            unknown `score`, `fill` or `upsample`; a bad `obs_max` or `incremental`; or a bad call
            (obs, target, actions, layout, batch_size), as `jaxsal.explain` reports it.
    """



def _prepare(call, apply_fn, params, *, patch, stride, fill, score, upsample, obs_max, incremental, return_grid):
    h, w, _ = call.hwc
    patch = C.check_fits("patch", patch, (h, w))
    stride = C.check_fits("stride", stride, (h, w))
    score = C.check_score(score, OCCLUSION_SCORES)
    C.check_upsample(upsample)
    gy, gx = occlusion_grid_shape((h, w), patch, stride)
    kind, value = C.fill_value(fill, call.x, obs_max)

    def perturb(consts, st, idx):
        m = _patch_mask(idx // gx, idx % gx, (h, w), patch, stride)[:, :, None]
        return st["x"] * (1.0 - m) + C.fill_of(kind, consts["fill"], st["x"]) * m

    def finish(consts, x, extra, scores):
        return C.resize_grid(scores, (gy, gx), None if return_grid else (h, w), upsample)

    box = None
    if C.use_incremental(incremental, (patch, patch), (h, w)):
        box = (patch, patch, lambda i: ((i // gx) * stride, (i % gx) * stride))
    return C.prepared(call, perturb=perturb, score=C.make_score(score, call.target), finish=finish,
                      n_pert=gy * gx, consts={"fill": value}, box=box)


SPEC = C.perturbation_spec("occlusion", _prepare, C.options_of(occlusion), example={"patch": 4, "stride": 4})
occlusion = C.register(SPEC, occlusion)
