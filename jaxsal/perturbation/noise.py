"""Noise sensitivity (Greydanus et al. 2018): blur a soft local disk, measure the output change."""
from __future__ import annotations

import jax.numpy as jnp

from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation import _common as C
from jaxsal.perturbation import _disk as D

NOISE_SCORES = ("chosen_action", "output_l2", "drop", "one_minus", "softmax_drop")
PERTURBATIONS = ("blur", "black")


def check_radius(radius, hw) -> float:
    radius = C.check_positive_float("radius", radius)
    if radius > min(hw) / 2:
        raise SaliencyInputError(
            f"radius={radius} does not fit the {hw[0]}x{hw[1]} image: it must be <= {min(hw) / 2}")
    return radius


def disk_grid(call, *, radius, stride, perturbation, blur_sigma, fill, obs_max, mask_shape, score_fn,
              upsample, return_grid, incremental=None):
    """The engine's `Prepared` of scores with a disk mask M centred every `stride` px (Greydanus'
    grid): x' = x (1 - M) + B M, B = the frame-wise blurred state (perturbation="blur") or
    `fill`; maps are the (N, gy, gx) grid, resized to the input unless return_grid."""
    h, w, _ = call.hwc
    stride = C.check_fits("stride", stride, (h, w))
    radius = check_radius(radius, (h, w))
    D.check_mask_shape(mask_shape)
    C.check_upsample(upsample)
    if perturbation not in PERTURBATIONS:
        raise SaliencyInputError(f"perturbation must be one of {list(PERTURBATIONS)}, got {perturbation!r}")
    ys, xs = D.centres(h, stride), D.centres(w, stride)
    gy, gx = len(ys), len(xs)
    consts = {}
    if perturbation == "blur":
        sig = C.check_positive_float("blur_sigma", blur_sigma, allow_zero=True)
        consts.update(blur=(D.blur_matrix(h, sig), D.blur_matrix(w, sig)))
        kind = "blur"
    else:
        kind, consts["fill"] = C.fill_value(fill, call.x, obs_max)
    if mask_shape == "gaussian":
        consts.update(bh=D.blur_matrix(h, radius), bw=D.blur_matrix(w, radius))

    def states(params, consts, x, extra):
        return {"alt": D.blur_frames(x, *consts["blur"]) if kind == "blur"
                else jnp.broadcast_to(C.fill_of(kind, consts["fill"], x), (x.shape[0], 1, 1, x.shape[-1]))}

    def perturb(consts, st, idx):
        m = D.disk_mask((idx // gx) * stride, (idx % gx) * stride, (h, w), radius=radius,
                        shape=mask_shape, bh=consts.get("bh"), bw=consts.get("bw"))[:, :, None]
        return st["x"] * (1.0 - m) + st["alt"] * m

    def finish(consts, x, extra, scores):
        return C.resize_grid(scores, (gy, gx), None if return_grid else (h, w), upsample)

    box = None
    # the mask is exactly 0 beyond scipy's truncation radius int(4 sigma + .5) + 1 (disk)
    half = D.gaussian_half(radius) if mask_shape == "gaussian" else int(radius)
    if C.use_incremental(incremental, (2 * half + 1,) * 2, (h, w)):
        box = (2 * half + 1, 2 * half + 1,
               lambda i: ((i // gx) * stride - half, (i % gx) * stride - half))
    return C.prepared(call, perturb=perturb, score=score_fn, finish=finish, n_pert=gy * gx, consts=consts,
                      states=states, box=box)


# the method's signature and docstring; the function registered below runs SPEC on the engine
def noise_sensitivity(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
                      batch_size=None, precision="float32", radius: float = 3.0, stride: int = 3,
                      blur_sigma: float = 3.0, score: str = "chosen_action", perturbation: str = "blur", fill=0.0,
                      mask_shape: str = "gaussian", upsample: str = "bilinear", obs_max=None,
                      incremental: bool | None = None, return_grid: bool = False):
    """Noise-sensitivity maps (Greydanus et al. 2018): how the output changes when a soft local
    disk of the input is blurred, scored every `stride` px and resized to the input.

    The mask M is Greydanus' 5-pixel disk at the centre blurred with sigma `radius`, divided by
    its max; x' = x (1 - M) + blur(x, blur_sigma) M, the blur spatial only, per stacked frame
    (never across frames). Defaults are Paper B's (radius 3, stride 3, blur_sigma 3, score
    "chosen_action"); Greydanus' own are radius 5, stride 5 with score "output_l2".

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
        batch_size (int | None): model rows (states x mask positions) per forward pass; None:
            the backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        radius (float): the disk's radius in pixels (the Gaussian's sigma for
            `mask_shape="gaussian"`), at most half the image side.
        stride (int): pixels between mask centres.
        blur_sigma (float): the sigma of the blurred state blended in, >= 0.
        score (str): "chosen_action" (default) 1 - softmax(Q(x'))_a, Paper B's fix;
            "output_l2" Greydanus' 1/2 ||f(x) - f(x')||^2 over the whole output (fails the
            randomisation sanity check per Paper B); "drop" t(x) - t(x'); "one_minus"
            1 - t(x'); "softmax_drop" the drop of softmax(Q)_a.
        perturbation (str): "blur" (default) blends in the blurred state; "black" blends in
            `fill`.
        fill (float | str): what `perturbation="black"` blends in: a fraction of the value range
            (0 black, 0.5 grey = 127.5 for 0..255 frames; see `obs_max`), or "black", "grey",
            "white" or "mean" (each state's mean per stacked frame).
        mask_shape (str): "gaussian" (default, Greydanus' soft disk) or "hard" (a hard disk of
            `radius`).
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
        jaxsal.SaliencyInputError: `radius`, `stride` or `blur_sigma` out of range or not fitting
            the image; an unknown `score`, `perturbation`, `mask_shape`, `fill` or `upsample`; a bad
            `obs_max` or `incremental`; or a bad call (obs, target, actions, layout, batch_size), as
            `jaxsal.explain` reports it.
    """


def _prepare(call, apply_fn, params, *, score, **options):
    score = C.check_score(score, NOISE_SCORES)
    return disk_grid(call, score_fn=C.make_score(score, call.target), **options)


SPEC = C.perturbation_spec("noise_sensitivity", _prepare, C.options_of(noise_sensitivity),
                           example={"radius": 1.0, "stride": 4})
noise_sensitivity = C.register(SPEC, noise_sensitivity)
