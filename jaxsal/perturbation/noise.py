"""Noise sensitivity (Greydanus et al. 2018): blur a soft local disk, measure the output change."""
from __future__ import annotations

from jaxsal.batching import per_state
from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation import _common as C
from jaxsal.perturbation import _disk as D
from jaxsal.registry import register

NOISE_SCORES = ("chosen_action", "output_l2", "drop", "one_minus", "softmax_drop")
PERTURBATIONS = ("blur", "black")


def check_radius(radius, hw) -> float:
    radius = C.check_positive_float("radius", radius)
    if radius > min(hw) / 2:
        raise SaliencyInputError(
            f"radius={radius} does not fit the {hw[0]}x{hw[1]} image: it must be <= {min(hw) / 2}")
    return radius


def disk_grid_scores(prep, apply_fn, params, *, radius, stride, perturbation, blur_sigma,
                     fill, mask_shape, score_fn, incremental=None):
    """(N, gy, gx) scores with a disk mask M centred every `stride` px (Greydanus' grid):
    x' = x (1 - M) + B M, B = the frame-wise blurred state (perturbation="blur") or `fill`."""
    n, h, w, _ = prep.shape
    stride = C.check_fits("stride", stride, (h, w))
    radius = check_radius(radius, (h, w))
    D.check_mask_shape(mask_shape)
    if perturbation not in PERTURBATIONS:
        raise SaliencyInputError(f"perturbation must be one of {list(PERTURBATIONS)}, got {perturbation!r}")
    ys, xs = D.centres(h, stride), D.centres(w, stride)
    gy, gx = len(ys), len(xs)
    if perturbation == "blur":
        sig = C.check_positive_float("blur_sigma", blur_sigma, allow_zero=True)
        alt = per_state(_blurred, (), (D.blur_matrix(h, sig), D.blur_matrix(w, sig)), prep.x)
    else:
        alt = C.resolve_fill(fill, prep.x, prep.obs_max)
    consts = {}
    if mask_shape == "gaussian":
        consts = {"bh": D.blur_matrix(h, radius), "bw": D.blur_matrix(w, radius)}

    def perturb(consts, st, idx):
        m = D.disk_mask((idx // gx) * stride, (idx % gx) * stride, (h, w), radius=radius,
                        shape=mask_shape, bh=consts.get("bh"), bw=consts.get("bw"))[:, :, None]
        return st["x"] * (1.0 - m) + st["alt"] * m

    box = None
    # the mask is exactly 0 beyond scipy's truncation radius int(4 sigma + .5) + 1 (disk)
    half = int(4.0 * radius + 0.5) + 1 if mask_shape == "gaussian" else int(radius)
    if C.use_incremental(incremental, (2 * half + 1,) * 2, (h, w)):
        box = (2 * half + 1, 2 * half + 1,
               lambda i: ((i // gx) * stride - half, (i % gx) * stride - half))
    scores = C.perturbation_scores(
        prep, apply_fn, params, perturb=perturb, score=score_fn, n_pert=gy * gx,
        consts=consts, states={"alt": alt}, box=box)
    return C.grid_map(scores, (gy, gx), None)


def _blurred():
    """Each frame blurred on its own: (bh, bw), (S, H, W, C) -> (S, H, W, C)."""
    return lambda b, x: D.blur_frames(x, *b)


@register("noise_sensitivity")
def noise_sensitivity(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
                      batch_size=None, radius: float = 3.0, stride: int = 3, blur_sigma: float = 3.0,
                      score: str = "chosen_action", perturbation: str = "blur", fill=0.0,
                      mask_shape: str = "gaussian", upsample: str = "bilinear", obs_max=None,
                      incremental: bool | None = None, return_grid: bool = False):
    """Greydanus noise-sensitivity maps (N, H, W), scored every `stride` px and resized.

    Mask M = Greydanus' 5-pixel disk at the centre blurred with sigma `radius`, / its max;
    x' = x (1 - M) + blur(x, blur_sigma) M, the blur spatial only, per stacked frame (never
    across frames). Defaults are Paper B's: radius 3, stride 3, blur_sigma 3, and its fixed score
    "chosen_action" = 1 - softmax(Q(x'))_a; score="output_l2" is Greydanus' original
    1/2 ||f(x) - f(x')||^2 over the whole output (fails the randomisation sanity check per
    Paper B). perturbation="black" fills with `fill` (fraction of the value range) instead of
    blurring; mask_shape="hard" uses a hard disk of `radius`. Greydanus' own: radius 5, stride 5.
    incremental: recompute only the mask's receptive field in flax convs (see
    `occlusion`; None = auto: on when the mask's nonzero box covers <= 1/4 of the image, e.g.
    the 27x27 px box of a Gaussian disk of radius 3).
    """
    prep = C.clean_pass(apply_fn, params, obs, layout=layout, target=target, actions=actions,
                        batch_size=batch_size, obs_max=obs_max)
    score = C.check_score(score, NOISE_SCORES)
    grid = disk_grid_scores(prep, apply_fn, params, radius=radius,
                            stride=stride, perturbation=perturbation, blur_sigma=blur_sigma,
                            fill=fill, mask_shape=mask_shape,
                            score_fn=C.make_score(score, prep.target),
                            incremental=incremental)
    if return_grid:
        return grid
    return C.upsample_grid(grid, prep.shape[1:3], upsample)
