"""Occlusion sensitivity (Zeiler & Fergus 2014, as benchmarked in Paper B): slide a filled patch."""
from __future__ import annotations

import math

import jax.numpy as jnp

from jaxsal.perturbation import _common as C
from jaxsal.registry import register

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


@register("occlusion")
def occlusion(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
              batch_size=None, patch: int = 2, stride: int = 2, fill=0.0, score: str = "one_minus",
              upsample: str = "bilinear", obs_max=None, incremental: bool | None = None,
              return_grid: bool = False):
    """Occlusion maps (N, H, W): score of the target when a `patch`x`patch` square (all stacked
    frames) is set to `fill`, on a grid of stride `stride`, resized to the input.

    Defaults are Paper B's: patch 2, stride 2 (42x42 grid on 84x84), black fill, score
    1 - Q_a(x') ("one_minus"). score="drop": t(x) - t(x'); "softmax_drop": drop of softmax(Q)_a.
    fill is a fraction of the value range (0 black, 0.5 grey = 127.5 for 0-255 frames; see
    `obs_max`), or "black"/"grey"/"mean". return_grid=True returns the (N, gy, gx) grid instead.
    batch_size bounds the model rows (states x patches) per forward pass. incremental: recompute
    only the patch's receptive field in each flax nn.Conv (VALID, undilated; any per-pixel op
    such as ReLU or a channel LayerNorm may sit between convs) and run the rest of the model
    as is. Equal to the plain path up to float rounding: every conv input is checked at run
    time to change only inside its box, else (a non-local op such as a spatial mean or a
    LayerNorm over H, W) the call reruns the plain path. Models without flax convs always run
    the plain path. None (default, auto): on when the patch covers <= 1/4 of the image
    (measured ~2.2-2.5x faster for 2x2 on the Nature CNN on CPU); True/False force it.
    """
    prep = C.clean_pass(apply_fn, params, obs, layout=layout, target=target, actions=actions,
                        batch_size=batch_size, obs_max=obs_max)
    n, h, w, _ = prep.shape
    patch = C.check_fits("patch", patch, (h, w))
    stride = C.check_fits("stride", stride, (h, w))
    score = C.check_score(score, OCCLUSION_SCORES)
    gy, gx = occlusion_grid_shape((h, w), patch, stride)
    fillv = C.resolve_fill(fill, prep.x, prep.obs_max)

    def perturb(consts, st, idx):
        m = _patch_mask(idx // gx, idx % gx, (h, w), patch, stride)[:, :, None]
        return st["x"] * (1.0 - m) + st["fill"] * m

    scores = C.perturbation_scores(
        prep, apply_fn, params, perturb=perturb,
        score=C.make_score(score, prep.target), n_pert=gy * gx, states={"fill": fillv},
        box=(patch, patch, lambda i: ((i // gx) * stride, (i % gx) * stride))
        if C.use_incremental(incremental, (patch, patch), (h, w)) else None)
    return C.grid_map(scores, (gy, gx), None if return_grid else (h, w), upsample)
